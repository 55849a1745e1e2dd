"""Batched MinHash (tidal.data.minhash) against datasketch's MinHash, value for value."""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch import MinHash

from tidal.data.filters import words
from tidal.data.minhash import shingle_hashes, signatures
from tidal.data.neardup import NearDupConfig, jaccard, shingles, signature, signature_batch

rng = random.Random(7)
VOCAB = [f"w{i}" for i in range(300)] + ["春", "风", "又", "绿", "江", "南", "岸", "Grüße", "naïve"]
DOCS = ["", "one", "two words", "a b c d", "a b c d e", "春风又绿江南岸", "   \n "] + [
    " ".join(rng.choice(VOCAB) for _ in range(rng.randint(1, 400))) for _ in range(60)
]


def _reference(hashes: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """datasketch's own MinHash over the same 32-bit shingle hashes (identity hash function)."""
    m = MinHash(num_perm=num_perm, seed=seed, hashfunc=lambda x: x)
    if hashes.size:
        m.update_batch([int(h) for h in hashes])
    return np.asarray(m.hashvalues, dtype=np.uint32)


@pytest.mark.parametrize(("num_perm", "seed", "size"), [(112, 1, 5), (16, 3, 1), (64, 0, 3)])
def test_batched_signatures_equal_datasketch(num_perm, seed, size):
    hashes, counts = shingle_hashes([words(d) for d in DOCS], size)
    sigs = signatures(hashes, counts, num_perm, seed)
    assert sigs.shape == (len(DOCS), num_perm) and sigs.dtype == np.uint32
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for i, doc in enumerate(DOCS):
        expected_count = len(shingles(doc, size))
        assert counts[i] >= expected_count  # a multiset: repeated shingles repeat here
        if expected_count == 0:
            assert counts[i] == 0 and (sigs[i] == np.iinfo(np.uint32).max).all()
        ref = _reference(hashes[offsets[i] : offsets[i + 1]], num_perm, seed)
        np.testing.assert_array_equal(sigs[i], ref, err_msg=f"document {i}")


def test_shingle_hashes_are_a_function_of_the_shingle_only():
    """The same shingle hashes the same in any document, position and batch; the sets of
    distinct shingle hashes have the sizes of the exact shingle sets."""
    hashes, counts = shingle_hashes([words(d) for d in DOCS], 5)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for i, doc in enumerate(DOCS):
        alone, _ = shingle_hashes([words(doc)], 5)
        np.testing.assert_array_equal(alone, hashes[offsets[i] : offsets[i + 1]])
        assert len(set(alone.tolist())) == len(shingles(doc, 5))
    # a document shorter than a shingle never matches a longer one containing its words
    short, _ = shingle_hashes([words("a b c d")], 5)
    long_, _ = shingle_hashes([words("a b c d e f")], 5)
    assert not set(short.tolist()) & set(long_.tolist())


def test_minhash_estimates_jaccard():
    cfg = NearDupConfig(enabled=True, bands=32, rows=8)
    base = [f"t{i}" for i in range(400)]
    a = " ".join(base)
    b = " ".join(base[:340] + [f"x{i}" for i in range(60)])
    sa, sb = signature_batch([a, b], cfg)
    estimate = float((sa == sb).mean())
    assert abs(estimate - jaccard(shingles(a, 5), shingles(b, 5))) < 0.08
    np.testing.assert_array_equal(signature(a, cfg), sa)
