"""Mix step: exact largest-remainder counts, seeded order, refusals."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from tidal.context import StepContext
from tidal.data import mix as mix_step
from tidal.data.shards import TokenizerMismatch, load_token_sequences, write_token_shards

SEQ_LEN = 8
HASH = "ab" * 32


def write_tokenize_step(
    step_dir: Path,
    source_index: int,
    n_sequences: int,
    tokenizer_hash: str = HASH,
    seq_len: int = SEQ_LEN,
) -> Path:
    """A tokenize-step-shaped directory whose sequence k is filled with 1000*source_index + k."""
    step_dir.mkdir(parents=True)
    values = 1000 * source_index + np.arange(n_sequences, dtype=np.uint16)
    write_token_shards(step_dir, np.repeat(values[:, None], seq_len, axis=1), shards=2)
    meta = {
        "tokenizer_hash": tokenizer_hash,
        "seq_len": seq_len,
        "dtype": "uint16",
        "n_sequences": n_sequences,
        "n_tokens": n_sequences * seq_len,
        "n_documents": n_sequences,
        "vocab_size": 5000,
        "tokens_dropped_tail": 0,
        "documents_failed": 0,
    }
    (step_dir / "meta.json").write_text(json.dumps(meta))
    return step_dir


AVAILABLE = {"brown": 100, "gcide": 50, "songci": 7}
WEIGHTS = {"brown": 0.5, "gcide": 0.3, "songci": 0.2}


@pytest.fixture()
def inputs(tmp_path) -> dict[str, Path]:
    return {
        f"tokenize-{src}": write_tokenize_step(tmp_path / f"tokenize-{src}", i + 1, n)
        for i, (src, n) in enumerate(sorted(AVAILABLE.items()))
    }


def run_mix(inputs: dict[str, Path], out: Path, seed: int = 7, **config) -> dict:
    out.mkdir(parents=True)
    config = {
        "weights": WEIGHTS,
        "inputs": {s: f"tokenize-{s}" for s in WEIGHTS},
        "shards": 3,
        "n_sequences": None,
        **config,
    }
    mix_step.run(StepContext("mix-t", "mix", "mix", config, out, inputs, seed=seed))
    return json.loads((out / "mixture.json").read_text())


def test_largest_remainder_counts_by_hand():
    thirds = mix_step.normalize_weights({"a": 1, "b": 1, "c": 1})
    assert mix_step.largest_remainder_counts(thirds, 10) == {
        "a": 4,
        "b": 3,
        "c": 3,
    }  # tie -> earlier name
    w = mix_step.normalize_weights({"x": 0.5, "y": 0.3, "z": 0.2})
    assert w == {"x": Fraction(1, 2), "y": Fraction(3, 10), "z": Fraction(1, 5)}  # exact, not float
    assert mix_step.largest_remainder_counts(w, 7) == {"x": 4, "y": 2, "z": 1}  # 3.5, 2.1, 1.4


def test_default_total_is_the_largest_mixture_without_repetition(inputs, tmp_path):
    mixture = run_mix(inputs, tmp_path / "out")
    weights = mix_step.normalize_weights(WEIGHTS)
    n = mixture["n_sequences"]
    assert mixture["counts"] == mix_step.largest_remainder_counts(weights, n)
    assert all(mixture["counts"][s] <= AVAILABLE[s] for s in AVAILABLE)
    for bigger in range(n + 1, sum(AVAILABLE.values()) + 1):
        counts = mix_step.largest_remainder_counts(weights, bigger)
        assert any(counts[s] > AVAILABLE[s] for s in AVAILABLE), bigger
    assert mixture["realized"] == {s: mixture["counts"][s] / n for s in AVAILABLE}
    assert mixture["requested"] == {s: float(w) for s, w in weights.items()}
    assert mixture["sources"] == sorted(AVAILABLE) and mixture["tokenizer_hash"] == HASH


def test_sequences_match_labels_and_never_repeat(inputs, tmp_path):
    mixture = run_mix(inputs, tmp_path / "out")
    tokens = load_token_sequences(tmp_path / "out", tokenizer_hash=HASH, seq_len=SEQ_LEN)
    labels = np.load(tmp_path / "out" / "sources.npy")
    assert tokens.shape == (mixture["n_sequences"], SEQ_LEN) and tokens.dtype == np.uint16
    assert labels.dtype == np.uint8 and labels.shape == (mixture["n_sequences"],)
    firsts = tokens[:, 0].astype(int)
    assert len(set(firsts)) == len(firsts)  # no sequence repeated
    assert np.array_equal(
        firsts // 1000 - 1, labels
    )  # each label names the source the row came from
    for index, src in enumerate(mixture["sources"]):
        assert int((labels == index).sum()) == mixture["counts"][src]


def test_same_seed_same_bytes_other_seed_other_order(inputs, tmp_path):
    run_mix(inputs, tmp_path / "a", seed=7)
    run_mix(inputs, tmp_path / "b", seed=7)
    run_mix(inputs, tmp_path / "c", seed=8)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["mixture.json", "sources.npy"] + [
        f"tokens-0000{i}-of-00003.npy" for i in range(3)
    ]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "mixture.json").read_bytes() == (
        tmp_path / "c" / "mixture.json"
    ).read_bytes()
    assert not np.array_equal(
        load_token_sequences(tmp_path / "a"), load_token_sequences(tmp_path / "c")
    )


def test_explicit_total(inputs, tmp_path):
    mixture = run_mix(inputs, tmp_path / "out", n_sequences=20)
    assert mixture["counts"] == {"brown": 10, "gcide": 6, "songci": 4}
    with pytest.raises(mix_step.MixtureError, match="songci.*never repeated"):
        run_mix(inputs, tmp_path / "big", n_sequences=100)


def test_mismatched_tokenizer_hash_is_refused(inputs, tmp_path):
    other = {
        **inputs,
        "tokenize-songci": write_tokenize_step(tmp_path / "other", 3, 7, tokenizer_hash="cd" * 32),
    }
    with pytest.raises(mix_step.MixtureError, match="tokenizer_hash.*'brown'.*'songci'"):
        run_mix(other, tmp_path / "out")
    other = {**inputs, "tokenize-songci": write_tokenize_step(tmp_path / "len", 3, 7, seq_len=16)}
    with pytest.raises(mix_step.MixtureError, match="seq_len"):
        run_mix(other, tmp_path / "out2")


def test_weight_without_input_is_refused(inputs, tmp_path):
    with pytest.raises(mix_step.MixtureError, match=r"weight but no input \['udhr'\]"):
        run_mix(inputs, tmp_path / "out", weights={**WEIGHTS, "udhr": 0.1})
    with pytest.raises(ValueError, match="weights.songci\n  Input should be greater than 0"):
        run_mix(inputs, tmp_path / "out2", weights={**WEIGHTS, "songci": 0.0})


def test_reader_refuses_other_tokenizer(inputs, tmp_path):
    run_mix(inputs, tmp_path / "out")
    with pytest.raises(TokenizerMismatch, match="re-tokenize"):
        load_token_sequences(tmp_path / "out", tokenizer_hash="ef" * 32)
