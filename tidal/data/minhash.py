"""Batched MinHash signatures: a whole batch of documents in a few numpy operations.

Same sketch as datasketch's ``MinHash`` (scheme ``affine32``, the default of datasketch
>= 2.0: MurmurHash3's 32-bit finalizer on each 32-bit shingle hash, then ``num_perm``
affine maps ``h * a + b mod 2^32`` with datasketch's seeded ``a``, ``b``, and the minimum
per map), computed for every document of a batch at once instead of one ``MinHash`` object
and one Python SHA-1 call per shingle. Tests check it value for value against datasketch's
``MinHash(hashfunc=identity)`` fed the same shingle hashes.

Shingle hash (replaces datasketch's default SHA-1 of the shingle's bytes, which cost one
Python call per shingle): every distinct word of the batch gets a 64-bit BLAKE2b hash
``w``; a shingle of words ``w_0 .. w_{k-1}`` hashes to the polynomial
``(k + sum_j w_j * P^(k-1-j)) mod 2^64`` with ``P`` an odd 64-bit constant (the golden
ratio's, Knuth's multiplicative hashing), vectorised over sliding windows, folded to 32
bits by XOR of its halves. Shingles are those of :func:`tidal.data.neardup.shingles`: word
``shingle_size``-grams (CJK: a word per character), one shingle of all words for a
document with fewer words.

Memory: at most :data:`CHUNK_SHINGLES` x ``num_perm`` uint32 values at a time (about 1.8 MB
for 112 permutations: small enough to stay in the CPU's L2 cache, which made the step 2.7x
faster than 32,768-shingle chunks; the buffer is reused across chunks).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from functools import lru_cache

import numpy as np

P = np.uint64(0x9E3779B97F4A7C15)
CHUNK_SHINGLES = 4_096
_MASK32 = np.uint64(0xFFFFFFFF)
_P_INT = int(P)
_MASK64_INT = (1 << 64) - 1


@lru_cache(maxsize=8)
def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """datasketch's seeded ``(a, b)`` of the ``affine32`` scheme, each 1-D ``uint32[num_perm]``.

    Raises:
        ValueError: if the installed datasketch does not use the ``affine32`` scheme by default.
    """
    from datasketch import MinHash

    probe = MinHash(num_perm=num_perm, seed=seed)
    scheme = getattr(probe, "scheme", "legacy")
    if scheme != "affine32":
        raise ValueError(f"datasketch MinHash default scheme is {scheme!r}; tidal's batched MinHash mirrors 'affine32'")
    a, b = probe.permutations
    return np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer (Appleby, smhasher ``fmix32``) on ``uint32`` values."""
    h = h.astype(np.uint32, copy=True)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer (Appleby, smhasher ``fmix64``) on ``uint64`` values."""
    h = h.astype(np.uint64, copy=True)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


def word_hash(word: str) -> int:
    """64-bit BLAKE2b hash of ``word``'s UTF-8 bytes (lone surrogates passed through), little-endian."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def window_hashes(w: np.ndarray, size: int) -> np.ndarray:
    """The 64-bit polynomial hash ``(size * P^size + sum_j w[i+j] * P^(size-1-j)) mod 2^64`` of every
    window of ``size`` consecutive word hashes of ``w`` (1-D ``uint64``), vectorised.

    Returns:
        1-D ``uint64[len(w) - size + 1]`` (window ``i`` starts at word ``i``); empty when ``w`` is shorter.
    """
    n_win = w.size - size + 1
    if n_win <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = np.full(n_win, np.uint64(size), dtype=np.uint64)
    for j in range(size):
        h = h * P + w[j : j + n_win]
    return h


def shingle_hashes(doc_words: Iterable[Sequence[str]], size: int) -> tuple[np.ndarray, np.ndarray]:
    """32-bit shingle hashes of a batch of documents (module docstring).

    Args:
        doc_words: per document, its words (:func:`tidal.data.filters.words`); consumed
            lazily, one document's word list at a time (a batch's words as Python strings
            would cost about 60 bytes a word).
        size: words per shingle, >= 1.

    Returns:
        ``(hashes, counts)``: ``hashes`` 1-D ``uint32`` of every document's shingles in
        document order, ``counts`` 1-D ``int64[n_docs]`` shingles per document (0 for a
        document without words, 1 for one with fewer than ``size`` words).
    """
    hashed: dict[str, int] = {}  # each distinct word of the batch hashed once
    parts: list[np.ndarray] = []
    sizes: list[int] = []
    for ws in doc_words:
        sizes.append(len(ws))
        for word in set(ws).difference(hashed):
            hashed[word] = word_hash(word)
        parts.append(np.fromiter(map(hashed.__getitem__, ws), dtype=np.uint64, count=len(ws)))
    lengths = np.asarray(sizes, dtype=np.int64)
    w = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths
    counts = np.where(lengths >= size, lengths - size + 1, np.minimum(lengths, 1))
    out = np.empty(int(counts.sum()), dtype=np.uint64)
    long_docs = lengths >= size
    pos = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if long_docs.any() and w.size >= size:
        # every window of `size` consecutive words over the concatenation; a long document's
        # shingle k (output slot pos[i] + k) is the window starting at word starts[i] + k
        h = window_hashes(w, size)
        docs = np.flatnonzero(long_docs)
        slots = np.flatnonzero(np.repeat(long_docs, counts))
        out[slots] = h[slots + np.repeat(starts[docs] - pos[docs], counts[docs])]
    for i in np.flatnonzero((lengths > 0) & ~long_docs):  # fewer words than a shingle: one shingle
        value = int(lengths[i])
        for x in w[starts[i] : starts[i] + lengths[i]].tolist():
            value = (value * _P_INT + x) & _MASK64_INT
        out[pos[i]] = value
    folded = ((out >> np.uint64(32)) ^ out) & _MASK32
    return folded.astype(np.uint32), counts


def signatures(hashes: np.ndarray, counts: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """MinHash signatures from :func:`shingle_hashes`' output.

    Returns:
        ``uint32[n_docs, num_perm]``; a document without shingles gets all ``2^32 - 1``
        (datasketch's empty value).
    """
    a, b = permutations(num_perm, seed)
    n_docs = len(counts)
    sig = np.full((n_docs, num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
    if hashes.size == 0:
        return sig
    mixed = fmix32(hashes)
    doc_of = np.repeat(np.arange(n_docs), counts)
    buffer = np.empty((min(CHUNK_SHINGLES, mixed.size), num_perm), dtype=np.uint32)
    for lo in range(0, mixed.size, CHUNK_SHINGLES):
        hi = min(lo + CHUNK_SHINGLES, mixed.size)
        phv = np.multiply(mixed[lo:hi, None], a[None, :], out=buffer[: hi - lo])
        phv += b[None, :]  # uint32 arithmetic wraps mod 2^32
        docs = doc_of[lo:hi]
        first = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1]])
        mins = np.minimum.reduceat(phv, first, axis=0)
        rows = docs[first]
        sig[rows] = np.minimum(sig[rows], mins)
    return sig
