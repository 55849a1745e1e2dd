"""Stats step: the contract's rows, typed and sorted, over a real tokenizer -> tokenize -> mix chain."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.data.builders import write_clean_step
from tidal.context import StepContext
from tidal.data import mix as mix_step
from tidal.data import stats as stats_step
from tidal.data import tokenize as tokenize_step
from tidal.data import tokenizer as tokenizer_step

CLEAN_METRICS = {
    "documents_in",
    "documents_kept",
    "documents_filtered",
    "documents_duplicate",
    "documents_quarantined",
    "quarantine_rate",
    "duplicate_rate",
    "bytes_kept",
    "chars_p50",
    "chars_p90",
}
TOKENIZE_METRICS = {"tokens", "sequences", "unknown_token_rate", "byte_fallback_rate"}
MIX_METRICS = {"mixture_weight_requested", "mixture_weight_realized", "mixture_sequences", "mixture_epochs",
               "mixture_tokens_unused"}
ALL_METRICS = {"total_tokens", "quarantine_rate", "documents_in", "documents_kept",
               "tokens", "unknown_token_rate", "byte_fallback_rate", "mixture_tokens_unused",
               "mixture_unused_token_fraction"}


def texts_of(source: str, n: int) -> list[str]:
    words = {
        "en": ["data", "model", "the", "of", "token", "shard"],
        "zh": ["数据", "模型", "训练", "春", "风"],
    }[source]
    return [
        " ".join(words[(i + j) % len(words)] for j in range(3 + i % 25)) + f" {source}{i}"
        for i in range(n)
    ]


def ctx(
    name: str, kind: str, config: dict, out: Path, inputs: dict[str, Path], seed: int = 0
) -> StepContext:
    out.mkdir(parents=True)
    return StepContext(f"{name}-t", name, kind, config, out, inputs, seed=seed)


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chain")
    steps = {
        "clean-en": write_clean_step(
            root / "clean-en",
            texts_of("en", 300),
            "en",
            {
                "in": 320,
                "kept": 300,
                "filtered": {"min_chars": 8, "letter_fraction": 2},
                "duplicates": 6,
                "quarantined": {"invalid_utf8": 4},
            },
        ),
        "clean-zh": write_clean_step(
            root / "clean-zh",
            texts_of("zh", 200),
            "zh",
            {"in": 200, "kept": 200, "filtered": {}, "duplicates": 0, "quarantined": {}},
        ),
    }
    tok_config = {
        "mode": "train",
        "vocab_size": 320,
        "min_frequency": 2,
        "sources": ["clean-en", "clean-zh"],
    }
    tokenizer_step.run(ctx("tokenizer", "tokenizer", tok_config, root / "tokenizer", dict(steps)))
    steps["tokenizer"] = root / "tokenizer"
    for src in ("en", "zh"):
        config = {
            "source": src,
            "input": f"clean-{src}",
            "tokenizer": "tokenizer",
            "seq_len": 32,
            "shards": 2,
        }
        tokenize_step.run(
            ctx(f"tokenize-{src}", "tokenize", config, root / f"tokenize-{src}", steps)
        )
        steps[f"tokenize-{src}"] = root / f"tokenize-{src}"
    mix_config = {
        "weights": {"en": 0.7, "zh": 0.3},
        "inputs": {"en": "tokenize-en", "zh": "tokenize-zh"},
        "shards": 2,
    }
    mix_step.run(ctx("mix", "mix", mix_config, root / "mix", steps, seed=3))
    steps["mix"] = root / "mix"
    steps["root"] = root
    return steps


STATS_CONFIG = {
    "clean": {"en": "clean-en", "zh": "clean-zh"},
    "tokenize": {"en": "tokenize-en", "zh": "tokenize-zh"},
    "mix": "mix",
}


def test_contract_rows_present_typed_and_sorted(chain, tmp_path):
    stats_step.run(ctx("stats", "stats", STATS_CONFIG, tmp_path / "out", chain))
    table = pq.read_table(tmp_path / "out" / "stats.parquet")
    assert table.schema == pa.schema(
        [("source", pa.string()), ("metric", pa.string()), ("value", pa.float64())]
    )
    rows = list(zip(*(table.column(c).to_pylist() for c in ("source", "metric", "value"))))
    assert rows == sorted(rows)
    assert [
        tuple(r.values()) for r in json.loads((tmp_path / "out" / "stats.json").read_text())
    ] == rows
    metrics = {}
    for source, metric, value in rows:
        metrics.setdefault(source, {})[metric] = value
    assert set(metrics) == {"en", "zh", "all"}
    assert set(metrics["all"]) == ALL_METRICS
    assert set(metrics["en"]) == CLEAN_METRICS | TOKENIZE_METRICS | MIX_METRICS | {
        "filter_rate/min_chars",
        "filter_rate/letter_fraction",
        "quarantine/invalid_utf8",
    }
    assert set(metrics["zh"]) == CLEAN_METRICS | TOKENIZE_METRICS | MIX_METRICS

    en, al = metrics["en"], metrics["all"]
    assert (en["documents_in"], en["documents_kept"], en["documents_filtered"]) == (320, 300, 10)
    assert (en["documents_duplicate"], en["documents_quarantined"]) == (6, 4)
    assert en["quarantine_rate"] == 4 / 320 and en["duplicate_rate"] == 6 / 320
    assert en["filter_rate/min_chars"] == 8 / 320 and en["quarantine/invalid_utf8"] == 4
    assert en["bytes_kept"] == sum(len(t.encode()) for t in texts_of("en", 300))
    assert en["chars_p50"] == float(np.percentile([len(t) for t in texts_of("en", 300)], 50))
    assert metrics["zh"]["bytes_kept"] > sum(
        len(t) for t in texts_of("zh", 200)
    )  # UTF-8 bytes, not chars
    assert (
        al["documents_in"] == 520
        and al["documents_kept"] == 500
        and al["quarantine_rate"] == 4 / 520
    )

    mixture = json.loads((chain["mix"] / "mixture.json").read_text())
    tok_meta = json.loads((chain["tokenize-en"] / "meta.json").read_text())
    assert en["tokens"] == tok_meta["n_tokens"] and en["sequences"] == tok_meta["n_sequences"]
    assert al["total_tokens"] == mixture["n_sequences"] * 32
    assert (
        en["mixture_weight_requested"] == 0.7 and en["mixture_sequences"] == mixture["counts"]["en"]
    )
    assert abs(en["mixture_weight_realized"] - 0.7) < 0.02
    # issue 21, item 4: what the mixture leaves unused, per source and over the training tokens
    zh, zh_meta = metrics["zh"], json.loads((chain["tokenize-zh"] / "meta.json").read_text())
    unused = {src: (meta["n_sequences"] - mixture["counts"][src]) * 32 for src, meta in (("en", tok_meta),
                                                                                       ("zh", zh_meta))}
    assert (en["mixture_tokens_unused"], zh["mixture_tokens_unused"]) == (unused["en"], unused["zh"])
    assert en["mixture_epochs"] == mixture["counts"]["en"] / tok_meta["n_sequences"]
    assert al["mixture_tokens_unused"] == sum(unused.values())
    assert al["mixture_unused_token_fraction"] == sum(unused.values()) / (en["tokens"] + zh["tokens"])


def test_stats_are_byte_identical_on_rerun(chain, tmp_path):
    for out in ("a", "b"):
        stats_step.run(ctx("stats", "stats", STATS_CONFIG, tmp_path / out, chain))
    for name in ("stats.parquet", "stats.json", "stats.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    import matplotlib.image as mpimg

    picture = mpimg.imread(tmp_path / "a" / "stats.png")  # a valid PNG, drawn (issue 21, item 10)
    assert picture.ndim == 3 and picture.shape[1] > 1000 and picture.std() > 0
    assert b"Matplotlib" not in (tmp_path / "a" / "stats.png").read_bytes()  # no version chunk


def test_unbalanced_counts_are_refused(chain, tmp_path):
    bad = write_clean_step(
        tmp_path / "clean-bad",
        ["some text"],
        "bad",
        {"in": 5, "kept": 1, "filtered": {}, "duplicates": 0, "quarantined": {}},
    )
    with pytest.raises(ValueError, match=r"counts\.json: in \(5\) != .* \(1\)"):
        stats_step.run(
            ctx(
                "stats",
                "stats",
                {"clean": {"bad": "clean-bad"}},
                tmp_path / "out",
                {"clean-bad": bad},
            )
        )


def test_rows_of_a_real_clean_step_language_mix_hit_rates_and_all(tmp_path):
    from tests.data.test_clean import CONFIG, RECORDS, run_clean

    config = {**CONFIG, "filters": {"gopher_quality": {"min_words": 5}}, "language": {"allowed": ["en", "zh"]}}
    _, out = run_clean(tmp_path, "clean-toy", config, RECORDS)
    counts = json.loads((out / "counts.json").read_text())
    stats_step.run(ctx("stats", "stats", {"clean": {"toy": "clean-toy"}}, tmp_path / "stats", {"clean-toy": out}))
    rows = {(s, m): v for s, m, v in
            (tuple(r.values()) for r in json.loads((tmp_path / "stats" / "stats.json").read_text()))}
    kept = counts["kept"]
    assert kept > 0 and rows[("toy", "documents_kept")] == kept
    assert rows[("toy", "language/en")] == counts["languages"]["en"] / kept
    assert sum(v for (s, m), v in rows.items() if s == "toy" and m.startswith("language/")) == pytest.approx(1.0)
    assert rows[("toy", "duplicate_rate/exact")] == 2 / 11 and rows[("toy", "duplicate_rate/near")] == 0
    for rule, n in counts["hits"].items():
        assert rows[("toy", f"hit_rate/{rule}")] == n / 11
    assert rows[("toy", "hit_rate/gopher_quality.stop_words")] > 0  # the CJK poem has no English stop word
    assert rows[("toy", "chars_p10")] <= rows[("toy", "chars_p50")] <= rows[("toy", "chars_p99")]
    assert rows[("all", "documents_duplicate")] == 2 and rows[("all", "duplicate_rate")] == 2 / 11
    assert rows[("all", "language/en")] == rows[("toy", "language/en")]
    assert rows[("all", "chars_p50")] == rows[("toy", "chars_p50")]
