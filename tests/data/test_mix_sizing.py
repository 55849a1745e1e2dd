"""Issue 21, item 4: mixture sizing is explicit. Weights are normalized before hashing; a token
budget up-samples small sources up to ``max_epochs`` (and is refused beyond, naming the source);
the sizing rows reach the stats table; the default mixture keeps the bytes of mix v1."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tests.data.test_mix import AVAILABLE, SEQ_LEN, WEIGHTS, run_mix, write_tokenize_step
from tidal.core.planner import build_graph
from tidal.data import mix_sizing
from tidal.data.mix import MixtureError
from tidal.data.mix_config import MixtureSettings, normalized_weights
from tidal.data.shards import load_token_sequences
from tidal.data.stats import mix_rows
from tidal.recipe import load_recipe

BUDGET = {"mode": "token_budget", "tokens": 200 * SEQ_LEN, "max_epochs": 6.0}  # 200 sequences


@pytest.fixture()
def inputs(tmp_path) -> dict[str, Path]:
    return {
        f"tokenize-{src}": write_tokenize_step(tmp_path / f"tokenize-{src}", i + 1, n)
        for i, (src, n) in enumerate(sorted(AVAILABLE.items()))
    }


def digest(out: Path) -> str:
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sorted(out.iterdir()))).hexdigest()


def test_weights_are_normalized_before_hashing(tiny_data, tmp_path):
    """{a: 2, b: 2} and {a: 0.5, b: 0.5} are one mixture: same mix and gate ids (they differed before)."""
    from tests.conftest import TINY

    def ids(weights: dict) -> dict[str, str]:
        graph = build_graph(load_recipe(TINY, {"mixture.weights": weights}))
        return {name: graph[name].step_id for name in ("mix", "gate", "train")}

    assert ids({"brown": 2, "gcide": 2}) == ids({"brown": 0.5, "gcide": 0.5})
    assert ids({"brown": 4, "gcide": 3, "songci": 3}) == ids({"brown": 0.4, "gcide": 0.3, "songci": 0.3})
    assert ids({"brown": 1, "gcide": 1}) != ids({"brown": 0.6, "gcide": 0.4})
    hashed = build_graph(load_recipe(TINY, {"mixture.weights": {"brown": 2, "gcide": 2}}))["mix"].config["weights"]
    assert hashed == {"brown": 0.5, "gcide": 0.5}


def test_normalization_keeps_weights_that_sum_to_one_and_is_idempotent():
    tiny = {"brown": 0.4, "gcide": 0.3, "songci": 0.3}
    assert normalized_weights(tiny) == tiny  # sums to 1 as decimals: kept as written (its ids stay)
    thirds = normalized_weights({"a": 1.0, "b": 1.0, "c": 1.0})
    assert thirds == {"a": 0.333333333333, "b": 0.333333333333, "c": 0.333333333333}
    assert normalized_weights(thirds) == thirds  # a second pass (MixConfig re-validates) changes nothing
    odd = normalized_weights({"a": 7.0, "b": 3.0, "c": 0.1})
    assert normalized_weights(odd) == odd and abs(sum(odd.values()) - 1) < 1e-11
    # the mix step then divides the hashed values by their exact sum: thirds are exactly 1/3 there
    assert set(mix_sizing.normalize_weights(thirds).values()) == {mix_sizing.Fraction(1, 3)}


def test_smallest_source_mixture_keeps_the_bytes_of_mix_v1(inputs, tmp_path):
    """Digests of the outputs written by the mix step before sizing existed (main 003274f), on the
    same inputs: the default mode is byte-for-byte today's, so its STEP_VERSION stays 1."""
    run_mix(inputs, tmp_path / "default")
    run_mix(inputs, tmp_path / "n20", n_sequences=20)
    assert digest(tmp_path / "default") == "69f011c810a82ff0cbbf4b08dd53c558f02bb1964eeeefcd61daa4eb279ebc96"
    assert digest(tmp_path / "n20") == "020d3785b8b96abe6b6956db3ebb8635d7cb16f59f53b65ac6f87c32e701ac20"


def test_token_budget_upsamples_to_its_budget_deterministically(inputs, tmp_path):
    mixture = run_mix(inputs, tmp_path / "a", size=BUDGET)
    run_mix(inputs, tmp_path / "b", size=BUDGET)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")  # same bytes twice
    # 200 sequences by 0.5 / 0.3 / 0.2 out of 100 / 50 / 7 available
    assert mixture["counts"] == {"brown": 100, "gcide": 60, "songci": 40} and mixture["n_sequences"] == 200
    assert mixture["epochs"] == {"brown": 1.0, "gcide": 1.2, "songci": 40 / 7}
    assert mixture["size"] == BUDGET
    tokens = load_token_sequences(tmp_path / "a", seq_len=SEQ_LEN)
    labels = np.load(tmp_path / "a" / "sources.npy")
    assert tokens.shape == (200, SEQ_LEN)
    assert np.array_equal(tokens[:, 0] // 1000 - 1, labels)  # every row still names its source
    for index, (src, have) in enumerate(sorted(AVAILABLE.items())):
        rows, times = np.unique(tokens[labels == index, 0] % 1000, return_counts=True)
        assert rows.tolist() == list(range(have)), src  # whole passes: every sequence is used
        passes, rest = divmod(mixture["counts"][src], have)
        # a whole pass each, then a subset once more: 40 = 5 * 7 + 5 -> five rows 6 times, two 5 times
        assert sorted(times.tolist()) == [passes] * (have - rest) + [passes + 1] * rest, src
    other = run_mix(inputs, tmp_path / "c", seed=8, size=BUDGET)
    assert other["counts"] == mixture["counts"] and digest(tmp_path / "c") != digest(tmp_path / "a")


def test_a_source_beyond_max_epochs_is_refused_naming_it(inputs, tmp_path):
    with pytest.raises(MixtureError) as err:
        run_mix(inputs, tmp_path / "out", size={**BUDGET, "max_epochs": 5.0})
    message = str(err.value)
    assert message.startswith("step mix: mixture.size: source songci has 7 sequences (56 tokens), its share 0.2 "
                              "of 1,600 tokens needs 40 (320 tokens) = 5.72 epochs > max_epochs 5;")
    assert "gcide" not in message.split(";")[0] and "raise mixture.size.max_epochs" in message
    assert not (tmp_path / "out" / "mixture.json").exists()
    # max_epochs 1 (the default) never repeats: the budget must fit every source once
    with pytest.raises(MixtureError, match=r"source gcide has 50 sequences .* = 1\.20 epochs > max_epochs 1; "
                                           r"source songci"):
        run_mix(inputs, tmp_path / "once", size={"mode": "token_budget", "tokens": 200 * SEQ_LEN})


def test_size_settings_are_validated():
    settings = MixtureSettings.model_validate({"weights": {"a": 1.0}, "size": {"mode": "token_budget", "tokens": 10}})
    assert settings.size.max_epochs == 1.0 and settings.size_config() == {
        "size": {"mode": "token_budget", "tokens": 10, "max_epochs": 1.0}}
    assert MixtureSettings.model_validate({"weights": {"a": 1.0}}).size_config() == {}  # default: ids unchanged
    for bad, rule in (({"mode": "token_budget", "tokens": 10, "max_epochs": 0.5}, "max_epochs"),
                      ({"mode": "token_budget"}, "tokens"), ({"mode": "sometimes"}, "does not match")):
        with pytest.raises(ValueError, match=rule):
            MixtureSettings.model_validate({"weights": {"a": 1.0}, "size": bad})
    with pytest.raises(ValueError, match="n_sequences\n  fixes the size without repetition"):
        MixtureSettings.model_validate({"weights": {"a": 1.0}, "n_sequences": 5, "size": {
            "mode": "token_budget", "tokens": 10}})


def test_stats_rows_count_unused_tokens(inputs, tmp_path):
    run_mix(inputs, tmp_path / "small")
    available = {src: n for src, n in AVAILABLE.items()}
    rows = {(s, m): v for s, m, v in mix_rows(tmp_path / "small", available)}
    counts = json.loads((tmp_path / "small" / "mixture.json").read_text())["counts"]
    assert counts["songci"] == 7  # the smallest source for its weight is used whole ...
    unused = {src: (AVAILABLE[src] - counts[src]) * SEQ_LEN for src in AVAILABLE}
    assert unused["songci"] == 0 and unused["brown"] > 0  # ... and the others are cut
    for src in AVAILABLE:
        assert rows[(src, "mixture_tokens_unused")] == unused[src]
        assert rows[(src, "mixture_epochs")] == counts[src] / AVAILABLE[src]
    total = sum(AVAILABLE.values()) * SEQ_LEN
    assert rows[("all", "mixture_tokens_unused")] == sum(unused.values())
    assert rows[("all", "mixture_unused_token_fraction")] == pytest.approx(sum(unused.values()) / total)
    run_mix(inputs, tmp_path / "budget", size=BUDGET)
    rows = {(s, m): v for s, m, v in mix_rows(tmp_path / "budget", available)}
    assert rows[("all", "mixture_unused_token_fraction")] == 0.0 and rows[("songci", "mixture_epochs")] == 40 / 7
    assert not [m for s, m, _ in mix_rows(tmp_path / "budget") if m.startswith("mixture_tokens")]  # unknown sizes


def test_table_shows_tokens_weights_epochs_and_what_is_unknown():
    before = mix_sizing.plan_table(WEIGHTS, SEQ_LEN, None, None, {src: None for src in AVAILABLE})
    text = "\n".join(before.lines())
    assert "smallest_source" in text and "unknown: until the source's tokenize step is committed" in text
    assert before.unused_fraction() is None and before.problem is None
    budget = mix_sizing.plan_table(WEIGHTS, SEQ_LEN, BUDGET, None, {src: None for src in AVAILABLE})
    assert [r["tokens_taken"] for r in budget.rows()] == [800, 480, 320]  # a budget is known before tokenize
    after = mix_sizing.plan_table(WEIGHTS, SEQ_LEN, BUDGET, None, AVAILABLE)
    lines = after.lines()
    assert lines[0].startswith("mixture: token_budget 1,600 tokens (200 sequences of 8)")
    assert lines[1].split() == ["source", "weight", "tokens", "available", "tokens", "taken", "epochs", "tokens",
                                "unused"]
    assert lines[2].split() == ["brown", "0.5", "800", "800", "1.00", "0"]
    assert lines[4].split() == ["songci", "0.2", "56", "320", "5.72", "0"]
    assert lines[5].split() == ["total", "1", "1,256", "1,600", "0", "(0.0", "%)"]


def commit_tokenized(root: Path, recipe: Path, sequences: dict[str, int]) -> None:
    """Commit tokenize-step directories (``meta.json`` and token shards, sealed) at the ids ``recipe``
    plans, as a real tokenize run would leave them."""
    from tests.conftest import seal
    from tidal.core.load import load_pipeline

    graph = load_pipeline(recipe, storage_root=str(root)).graph
    for index, (src, n) in enumerate(sorted(sequences.items())):
        step = graph[f"tokenize-{src}"]
        out = write_tokenize_step(root / step.step_id, index + 1, n, seq_len=step.config["seq_len"])
        seal(out)


def test_plan_prints_the_mixture_table_and_refuses_a_budget_beyond_max_epochs(tiny_data, tmp_path, capsys):
    """`tidal plan` shows per source tokens available, weight, tokens taken, epochs and tokens unused: unknown
    before tokenize, read from the tokenize steps' meta.json after; a share beyond max_epochs is one error line."""
    import yaml

    from tidal.cli import main

    root, recipe = tmp_path / "root", tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    assert main(["plan", str(recipe), "--storage-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "mixture: smallest_source" in out
    assert [line.split() for line in out.splitlines() if line.startswith("  songci ")] == [
        ["songci", "0.3", "unknown", "unknown", "-", "unknown"]]

    commit_tokenized(root, recipe, {"brown": 2000, "gcide": 1000, "songci": 500})  # seq_len 128
    assert main(["plan", str(recipe), "--storage-root", str(root)]) == 0
    table = capsys.readouterr().out.split("mixture: ")[1].splitlines()
    # 500 songci sequences at 0.3 bound the mixture at 1,668 (0.3 * 1,668 = 500.4): brown gives 667 of 2,000
    assert table[2].split() == ["brown", "0.4", "256,000", "85,376", "0.34", "170,624"]
    assert table[4].split() == ["songci", "0.3", "64,000", "64,000", "1.00", "0"]
    assert table[5].split() == ["total", "1", "448,000", "213,504", "234,496", "(52.3", "%)"]

    tiny_data["mixture"]["size"] = {"mode": "token_budget", "tokens": 1_000_000, "max_epochs": 3}
    recipe.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    # size is hashed into the mix step only: the tokenize steps committed above keep their ids
    assert main(["plan", str(recipe), "--storage-root", str(root)]) == 1
    captured = capsys.readouterr()
    table = captured.out.split("mixture: ")[1].splitlines()
    assert table[0].startswith("token_budget 1,000,000 tokens (7,813 sequences of 128)")
    assert table[3].split() == ["gcide", "0.3", "128,000", "300,032", "2.35", "0"]
    assert table[4].split() == ["songci", "0.3", "64,000", "300,032", "4.69", "0"]
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert errors == [(f"error: {recipe}: mixture.size: source songci has 500 sequences (64,000 tokens), its share "
                       "0.3 of 1,000,000 tokens needs 2,344 (300,032 tokens) = 4.69 epochs > max_epochs 3; raise "
                       "mixture.size.max_epochs, lower mixture.size.tokens or the weight of songci, or add data")]
    tiny_data["mixture"]["size"]["max_epochs"] = 5
    recipe.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    assert main(["plan", str(recipe), "--storage-root", str(root)]) == 0
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_a_budget_the_gate_would_refuse_is_a_recipe_error(tmp_path):
    from tests.conftest import TINY
    from tidal.recipe import RecipeError

    with pytest.raises(RecipeError, match=r"mixture\.size\.tokens: 1,024 tokens \(in whole sequences of 128\) is "
                                          r"below gate\.min_total_tokens 500,000"):
        load_recipe(TINY, {"mixture.size": {"mode": "token_budget", "tokens": 1000}})


def test_the_mix_step_logs_and_the_report_prints_the_table(tiny_data, tmp_path, caplog):
    """The committed mix step (run by the runner, on committed tokenize steps) logs the table, records
    epochs and unused tokens in its summary, and `tidal report` prints the table with what it took."""
    import logging

    import yaml

    from tidal.core.load import load_pipeline
    from tidal.core.report import build_report, format_report

    root, recipe = tmp_path / "root", tmp_path / "r.yaml"
    tiny_data["mixture"]["size"] = {"mode": "token_budget", "tokens": 1_000_000, "max_epochs": 5}
    recipe.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    commit_tokenized(root, recipe, {"brown": 2000, "gcide": 1000, "songci": 500})
    pipe = load_pipeline(recipe, storage_root=str(root))
    with caplog.at_level(logging.INFO):
        result = pipe.run("mix")
    assert result.status == "run" and result.summary["n_sequences"] == 7813
    assert result.summary["epochs/songci"] == 2344 / 500 and result.summary["tokens_unused"] == 0
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("mixture: token_budget 1,000,000 tokens") for m in logged)
    assert any(m.split()[:6] == ["songci", "0.3", "64,000", "300,032", "4.69", "0"] for m in logged)
    report = build_report(pipe)
    assert report["mixture"][0].startswith("mixture: token_budget")
    text = format_report(report)
    assert "\n  mixture: token_budget 1,000,000 tokens" in text
    assert [line.split() for line in text.splitlines() if line.strip().startswith("brown")] == [
        ["brown", "0.4", "256,000", "400,000", "1.57", "0"]]
