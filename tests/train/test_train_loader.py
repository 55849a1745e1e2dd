"""Loader: batch(step) is a pure function of (seed, step); data contracts are enforced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tidal.train.loader import (
    BatchLoader,
    DataContractError,
    TokenShards,
    eval_sequences,
    read_tokenizer_meta,
)

HASH = "c" * 64


def write_dir(root: Path, sizes=(5, 7, 3), seq_len=6, dtype=np.uint16, meta="mixture.json", tok_hash=HASH):
    root.mkdir(parents=True)
    start = 0
    for i, n in enumerate(sizes):
        # row r of the whole dataset holds r in every position, so rows are recognisable
        np.save(root / f"tokens-{i:05d}-of-{len(sizes):05d}.npy",
                np.repeat(np.arange(start, start + n, dtype=dtype)[:, None], seq_len, axis=1))
        start += n
    (root / meta).write_text(json.dumps({"tokenizer_hash": tok_hash, "seq_len": seq_len}))
    return root


def test_batch_is_pure_function_of_seed_and_step(tmp_path):
    shards = TokenShards(write_dir(tmp_path / "d"), tokenizer_hash=HASH)
    assert shards.n_sequences == 15
    a = BatchLoader(shards, batch_size=4, seed=2**62 + 7)
    b = BatchLoader(TokenShards(tmp_path / "d", tokenizer_hash=HASH), batch_size=4, seed=2**62 + 7)
    forward = [a.batch(s) for s in range(12)]
    backward = [b.batch(s) for s in reversed(range(12))][::-1]
    for x, y in zip(forward, backward):
        np.testing.assert_array_equal(x, y)
    assert forward[0].shape == (4, 6) and forward[0].dtype == np.int32
    # every sequence exactly once per epoch: positions 0..14 are epoch 0, 15..29 epoch 1
    rows = np.concatenate([a.indices(s) for s in range(12)])
    assert sorted(rows[:15]) == list(range(15)) and sorted(rows[15:30]) == list(range(15))
    assert not np.array_equal(rows[:15], rows[15:30])  # reshuffled per epoch
    np.testing.assert_array_equal(forward[1][:, 0], a.indices(1))  # content matches the index
    other = BatchLoader(shards, batch_size=4, seed=8)
    assert not all(np.array_equal(a.indices(s), other.indices(s)) for s in range(4))


def test_tokenizer_hash_mismatch_names_both_hashes_and_dir(tmp_path):
    d = write_dir(tmp_path / "d", meta="meta.json", tok_hash="d" * 64)
    with pytest.raises(DataContractError) as info:
        TokenShards(d, tokenizer_hash=HASH, tokenizer_dir="/x/tokenizer")
    msg = str(info.value)
    assert "d" * 64 in msg and HASH in msg and str(d / "meta.json") in msg and "/x/tokenizer" in msg


def test_bad_shards_and_ids_are_refused(tmp_path):
    d = write_dir(tmp_path / "wrong_dtype", dtype=np.int64)
    with pytest.raises(DataContractError, match="uint16/uint32"):
        TokenShards(d, tokenizer_hash=HASH)
    with pytest.raises(DataContractError, match="no mixture.json or meta.json"):
        TokenShards(tmp_path, tokenizer_hash=HASH)
    shards = TokenShards(write_dir(tmp_path / "ok"), tokenizer_hash=HASH)
    rule = r"tokens-00001-of-00003.npy row 4: token id 9 >= vocab_size 9"
    with pytest.raises(DataContractError, match=rule):
        shards.rows(np.array([0, 9]), vocab_size=9)


def test_eval_sequences_and_tokenizer_meta(tmp_path):
    shards = TokenShards(write_dir(tmp_path / "d"), tokenizer_hash=HASH)
    batches = eval_sequences(shards, n_batches=3, batch_size=4)
    assert [b.shape[0] for b in batches] == [4, 4, 4]
    assert np.concatenate(batches)[:, 0].tolist() == list(range(12))
    assert sum(b.shape[0] for b in eval_sequences(shards, n_batches=9, batch_size=4)) == 15
    (tmp_path / "tokenizer_meta.json").write_text(json.dumps({"tokenizer_hash": HASH}))
    with pytest.raises(DataContractError, match="missing key 'vocab_size'"):
        read_tokenizer_meta(tmp_path)
