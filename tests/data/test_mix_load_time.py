"""Load-time mixing (tidal/data/mixture_index.py, tidal/data/mix_load_time.py, tidal/train/mixed.py): the
index is a pure function with exact per-block counts, the mix step writes no tokens, a reweight rewrites
under 1 % of a copied mixture's bytes, and the loader reads each position's row from its source."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from tests.data.test_mix import write_tokenize_step
from tidal.context import StepContext
from tidal.data import mix as mix_step
from tidal.data.mix_config import MixtureSettings
from tidal.data.mix_sizing import MixtureError
from tidal.data.mixture_index import MixtureIndex, Stage, _keys, permute, stage_counts
from tidal.files.step_files import StepFiles
from tidal.train.loader import BatchLoader
from tidal.train.mixed import MixedShards

SOURCES = ["a", "b", "c"]


def two_stage_index(available=None, block=64, switch=5, seed=7) -> MixtureIndex:
    first = stage_counts({"a": Fraction(1, 2), "b": Fraction(1, 4), "c": Fraction(1, 4)}, SOURCES, block)
    second = stage_counts({"a": Fraction(1, 10), "b": Fraction(9, 10)}, SOURCES, block)
    return MixtureIndex(SOURCES, available or {"a": 100, "b": 37, "c": 5}, seed, block,
                        [Stage(0, first), Stage(switch, second)])


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64, 1000, 4097])
def test_permute_is_a_bijection_and_the_key_changes_it(n):
    x = np.arange(n)
    y = permute(x, n, _keys(1, 2, 3))
    assert sorted(y.tolist()) == list(range(n))
    if n >= 17:
        assert not np.array_equal(y, permute(x, n, _keys(1, 2, 4)))
        assert not np.array_equal(y, x)


def test_every_block_holds_its_stage_counts_and_draws_cover_each_pass():
    index = two_stage_index()
    assert index.counts.tolist() == [[32, 16, 16], [6, 58, 0]]
    n = 64 * 12
    src, row = index.locate(np.arange(n))
    for block in range(12):  # counted position by position, not by the stage table
        found = np.bincount(src[block * 64:(block + 1) * 64], minlength=3)
        assert found.tolist() == index.counts[0 if block < 5 else 1].tolist()
        index.check_block(block)
    for stop in (n, n - 13, 64 * 5 + 1, 7):
        assert index.drawn(stop).tolist() == np.bincount(src[:stop], minlength=3).tolist()
    _, draws = index._draws(np.arange(n))
    for s, have in enumerate(index.available.tolist()):
        order = np.argsort(draws[src == s])
        assert np.array_equal(draws[src == s][order], np.arange((src == s).sum()))  # draws 0, 1, 2 ... of s
        rows = row[src == s][order]
        for start in range(0, len(rows) - have + 1, have):  # every pass reads each row once
            assert sorted(rows[start:start + have].tolist()) == list(range(have))
        assert len({tuple(rows[i:i + have]) for i in range(0, len(rows) - have + 1, have)}) > 1 or len(rows) < 2 * have


def test_same_inputs_same_index_and_the_seed_changes_it():
    one, two, other = two_stage_index(), two_stage_index(), two_stage_index(seed=8)
    positions = np.arange(0, 2000, 3)
    assert all(np.array_equal(a, b) for a, b in zip(one.locate(positions), two.locate(positions)))
    assert not np.array_equal(one.locate(positions)[1], other.locate(positions)[1])
    rebuilt = MixtureIndex.from_json(json.loads(json.dumps(one.to_json())), SOURCES)
    assert all(np.array_equal(a, b) for a, b in zip(one.locate(positions), rebuilt.locate(positions)))


def test_a_block_that_breaks_its_counts_is_refused():
    index = two_stage_index()
    index.counts[1] = [10, 54, 0]  # what a wrong index would claim for blocks 5..
    with pytest.raises(MixtureError, match="block 5 .stage 1. realizes counts"):
        index.check_block(5)


SEQ = 8
AVAILABLE = {"a": 300, "b": 120, "c": 40}


@pytest.fixture()
def tokenized(tmp_path) -> dict[str, Path]:
    return {f"tokenize-{src}": write_tokenize_step(tmp_path / f"tokenize-{src}", i + 1, n, seq_len=SEQ)
            for i, (src, n) in enumerate(sorted(AVAILABLE.items()))}


def mix(tokenized: dict[str, Path], out: Path, **config) -> tuple[dict, dict]:
    out.mkdir(parents=True)
    config = {"weights": {"a": 0.5, "b": 0.3, "c": 0.2}, "inputs": {s: f"tokenize-{s}" for s in AVAILABLE},
              "n_sequences": None, "shards": 1, "load_time": True, "block_sequences": 16,
              "size": {"mode": "token_budget", "tokens": 400 * SEQ, "max_epochs": 3.0}, **config}
    metrics = mix_step.run(StepContext("mix-t", "mix", "mix", config, out, tokenized, seed=11))
    return json.loads((out / "mixture.json").read_text()), metrics


STAGES = [{"weights": {"a": 0.8, "b": 0.2}, "until_fraction": 0.5}, {"weights": {"a": 0.2, "b": 0.3, "c": 0.5}}]


def test_the_mix_step_writes_an_index_not_tokens(tokenized, tmp_path):
    mixture, metrics = mix(tokenized, tmp_path / "mix", stages=STAGES)
    assert sorted(p.name for p in (tmp_path / "mix").iterdir()) == ["mixture.json"]
    stages = mixture["load_time"]["stages"]
    assert [s["start_sequence"] for s in stages] == [0, 192] and stages[0]["end_sequence"] == 192  # 0.5*400/16
    assert stages[0]["counts_per_block"] == {"a": 13, "b": 3, "c": 0}  # 12.8, 3.2 -> 13, 3
    assert stages[1]["counts_per_block"] == {"a": 3, "b": 5, "c": 8}  # 3.2, 4.8, 8
    assert stages[0]["drawn"] == {"a": 13 * 12, "b": 3 * 12, "c": 0}
    assert mixture["n_sequences"] == 400 and sum(mixture["counts"].values()) == 400
    assert mixture["requested"] == {"a": 0.5, "b": 0.25, "c": 0.25}  # each stage's weights by its half
    assert all(abs(mixture["realized"][s] - mixture["requested"][s]) < 0.02 for s in "abc")  # what the gate holds
    assert metrics["stage_counts_exact"] == 1 and metrics["sequences/c"] == mixture["counts"]["c"]
    index = MixtureIndex.from_json(mixture["load_time"]["index"], mixture["sources"])
    src = index.sources_of(np.arange(400))
    assert np.bincount(src, minlength=3).tolist() == [mixture["counts"][s] for s in "abc"]
    assert (src[:192] != 2).all() and (src[192:] == 2).any()  # c only in the second stage


def test_a_reweight_rewrites_under_one_percent_of_a_copied_mixture(tmp_path):
    seq = 256  # a copied mixture's bytes grow with the tokens, the index's do not
    tokenized = {f"tokenize-{src}": write_tokenize_step(tmp_path / f"tokenize-{src}", i + 1, n, seq_len=seq)
                 for i, (src, n) in enumerate(sorted(AVAILABLE.items()))}
    base = {"weights": {"a": 0.5, "b": 0.3, "c": 0.2}, "inputs": {s: f"tokenize-{s}" for s in AVAILABLE},
            "n_sequences": None, "shards": 1, "size": {"mode": "token_budget", "tokens": 400 * seq, "max_epochs": 3.0}}

    def written(name: str, **config) -> int:
        out = tmp_path / name
        out.mkdir()
        mix_step.run(StepContext("mix-t", "mix", "mix", {**base, **config}, out, tokenized, seed=11))
        return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())

    copied = written("copied", weights={"a": 0.4, "b": 0.4, "c": 0.2})
    reweighted = written("index", weights={"a": 0.4, "b": 0.4, "c": 0.2}, load_time=True)
    assert copied > 400 * seq * 2 and reweighted / copied < 0.01, (reweighted, copied)


def test_draws_beyond_max_epochs_are_refused(tokenized, tmp_path):
    with pytest.raises(MixtureError, match="source 'c' gives 40 sequences and the mixture draws"):
        mix(tokenized, tmp_path / "mix", size={"mode": "token_budget", "tokens": 400 * SEQ, "max_epochs": 1.0},
            stages=STAGES)


def test_smallest_source_repeats_nothing(tokenized, tmp_path):
    mixture, _ = mix(tokenized, tmp_path / "mix", size={"mode": "smallest_source"})
    assert all(mixture["counts"][s] <= AVAILABLE[s] for s in AVAILABLE)
    assert mixture["counts"]["c"] >= AVAILABLE["c"] - 16  # the smallest source bounds it, to within a block


def test_stage_ends_that_meet_in_one_block_are_refused(tokenized, tmp_path):
    stages = [{"weights": {"a": 1}, "until_fraction": 0.48}, {"weights": {"b": 1}, "until_fraction": 0.49},
              {"weights": {"c": 1}}]
    with pytest.raises(MixtureError, match=r"stages\[1\] ends at sequence 196, which rounds to block 12"):
        mix(tokenized, tmp_path / "mix", stages=stages)


@pytest.mark.parametrize("settings, field, rule", [
    ({"stages": [{"weights": {"a": 1}}]}, "stages", "set mixture.load_time: true"),
    ({"load_time": True, "stages": [{"weights": {"a": 1}}]}, "stages", "needs size.mode token_budget"),
    ({"load_time": True, "size": {"mode": "token_budget", "tokens": 10}, "stages": [{"weights": {"z": 1}}]},
     "stages.0.weights", "sources ['z'] are not in mixture.weights"),
    ({"load_time": True, "size": {"mode": "token_budget", "tokens": 10},
      "stages": [{"weights": {"a": 1}, "until_fraction": 0.5}]}, "stages.0", "the last runs to the end"),
    ({"load_time": True, "size": {"mode": "token_budget", "tokens": 10},
      "stages": [{"weights": {"a": 1}, "until_fraction": 0.5}, {"weights": {"a": 1}, "until_fraction": 0.4},
                 {"weights": {"a": 1}}]}, "stages", "stage ends must increase"),
    ({"load_time": True, "size": {"mode": "token_budget", "tokens": 10},
      "stages": [{"weights": {"a": 1}, "until_fraction": 0.5, "until_step": 3}, {"weights": {"a": 1}}]},
     "stages.0.until_step", "not both"),
])
def test_bad_stage_settings_name_the_field(settings, field, rule):
    with pytest.raises(ValidationError) as err:
        MixtureSettings(weights={"a": 1, "b": 1}, **settings)
    assert rule in str(err.value) and field in str(err.value), str(err.value)


def test_copied_mixtures_keep_their_config_bytes():
    assert MixtureSettings(weights={"a": 1, "b": 3}).model_dump() == {
        "weights": {"a": 0.25, "b": 0.75}, "n_sequences": None, "shards": 1}


def test_the_loader_reads_each_position_from_its_source_in_order(tokenized, tmp_path):
    mixture, _ = mix(tokenized, tmp_path / "mix", stages=STAGES)
    where = {name: StepFiles.open(path) for name, path in tokenized.items()}
    shards = MixedShards(StepFiles.open(tmp_path / "mix"), where.__getitem__, tokenizer_hash="ab" * 32)
    loader = BatchLoader(shards, batch_size=24, seed=123)
    index = MixtureIndex.from_json(mixture["load_time"]["index"], mixture["sources"])
    for step in (0, 7, 8, 30):  # step 8 crosses the stage end (sequence 192); 30 reads past the mixture's 400
        batch = loader.batch(step)
        src, row = index.locate(np.arange(step * 24, step * 24 + 24))
        assert np.array_equal(batch[:, 0], 1000 * (src + 1) + row)  # write_tokenize_step: row k = 1000*(i+1)+k
        assert np.array_equal(batch, BatchLoader(shards, batch_size=24, seed=999).batch(step))  # not reshuffled
    with pytest.raises(ValueError, match="leave train.block_reads out"):
        BatchLoader(shards, batch_size=24, seed=1, block_reads=(4096, 1))


def test_a_source_that_changed_since_mixing_is_refused(tokenized, tmp_path):
    mix(tokenized, tmp_path / "mix", stages=STAGES)
    other = write_tokenize_step(tmp_path / "other-b", 2, 119, seq_len=SEQ)
    where = {name: StepFiles.open(path) for name, path in tokenized.items()} | {"tokenize-b": StepFiles.open(other)}
    with pytest.raises(Exception, match=r"119 sequences, but .*mixture.json indexes 120 of source 'b'"):
        MixedShards(StepFiles.open(tmp_path / "mix"), where.__getitem__, tokenizer_hash="ab" * 32)
