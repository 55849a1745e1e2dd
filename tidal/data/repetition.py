"""Repetition counts behind the Gopher repetition rules (:class:`tidal.data.filters.GopherRepetition`).

Pure functions of a document's lines, paragraphs or words (:func:`tidal.data.filters.words`);
the rules and thresholds, with their source (Rae et al. 2021, "Scaling Language Models:
Methods, Analysis & Insights from Training Gopher", Appendix A.1.2, Table A1, as implemented
by datatrove's ``GopherRepetitionFilter``), stay in :mod:`tidal.data.filters`.

Shortcut used throughout (exact, not a heuristic): an n-gram that occurs twice contains
(n-1)-grams that occur twice, so once no n-gram of a document repeats, no longer one does and
its counts are known (0) without being computed. Most short documents have no repeated word
bigram (Brown-like prose excepted), so their n-gram rules cost one ``Counter``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np

# From this many words on, top n-grams are counted with numpy (:func:`top_ngram`'s packed
# path); below it a Counter of tuples is cheaper than numpy's per-call overhead (measured on
# the data bench's dictionary entries and poems, about 90 words each). Both are exact.
NUMPY_FROM_WORDS = 400


def duplicates(items: list[str]) -> tuple[int, int]:
    """``(number of items equal to an earlier item, their total length in characters)``."""
    if len(set(items)) == len(items):
        return 0, 0
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


def word_codes(doc_words: list[str]) -> np.ndarray:
    """``int64[len(doc_words)]``: each word's index among the document's distinct words, in
    order of first occurrence."""
    index: dict[str, int] = {}
    return np.fromiter((index.setdefault(w, len(index)) for w in doc_words), dtype=np.int64, count=len(doc_words))


def top_ngram(doc_words: list[str], n: int, codes: np.ndarray | None = None,
              lengths: np.ndarray | None = None) -> tuple[int, int]:
    """``(characters, count)`` of the most frequent word n-gram (ties: the n-gram that occurs
    first): its word characters times its count, and its count; ``(0, count)`` when it occurs
    once (no n-gram repeats). Needs at least ``n`` words.

    With ``codes`` (:func:`word_codes`) and ``lengths`` (characters per word, ``int64``), the
    n-grams are packed exactly into one int64 each (``n`` codes in base ``vocabulary size``)
    and counted with ``np.unique``; when they do not fit in 63 bits, or without ``codes``, a
    ``Counter`` of tuples does it. Both give the same result (``tests/data/test_filters.py``).
    """
    if codes is not None and lengths is not None and codes.size >= n:
        base = int(codes.max()) + 1
        if base ** n < 2**63:
            m = codes.size - n + 1
            packed = np.zeros(m, dtype=np.int64)
            for k in range(n):
                packed = packed * base + codes[k : k + m]
            _, first, counts = np.unique(packed, return_index=True, return_counts=True)
            top = int(counts.max())
            if top < 2:
                return 0, top
            start = int(first[counts == top].min())  # the first n-gram to occur among the most frequent
            return int(lengths[start : start + n].sum()) * top, top
    grams = Counter(zip(*(doc_words[k:] for k in range(n))))  # the n-grams in order, counted in C
    gram, count = grams.most_common(1)[0]
    return (sum(map(len, gram)) * count if count > 1 else 0), count


def dup_ngram_chars(doc_words: list[str], n: int) -> int | None:
    """Word characters of n-grams that repeat an earlier n-gram, scanning left to right and
    skipping past each repeat (non-overlapping), as in datatrove's ``find_all_duplicate``;
    ``None`` (count 0) when no n-gram repeats at all, so no longer n-gram can repeat either."""
    grams = list(zip(*(doc_words[k:] for k in range(n))))  # grams[i] == tuple(doc_words[i : i + n])
    if len(set(grams)) == len(grams):  # no n-gram repeats (most documents): nothing to scan
        return None
    seen: set[tuple[str, ...]] = set()
    chars = i = 0
    while i < len(grams):
        gram = grams[i]
        if gram in seen:
            chars += sum(len(w) for w in gram)
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars


def ngram_chars(doc_words: list[str], top_ns: Iterable[int], dup_ns: Iterable[int]
                ) -> tuple[dict[int, int], dict[int, int | None]]:
    """The n-gram repetition counts of one document, in characters of words.

    Args:
        doc_words: the document's words.
        top_ns: the ``n`` of the top n-gram rules (:func:`top_ngram`).
        dup_ns: the ``n`` of the duplicated n-gram rules (:func:`dup_ngram_chars`).

    Returns:
        ``(top, dup)``: ``top[n]`` the top n-gram's characters (0: no n-gram repeats) and
        ``dup[n]`` the duplicated n-grams' characters (``None``: none repeats), for each ``n``
        of at most ``len(doc_words)`` words (a rule without its ``n`` does not apply). Counts
        implied by a shorter n-gram that never repeats (module docstring) are not computed.
    """
    size = len(doc_words)
    no_repeat_from = 1 if size and len(set(doc_words)) == size else None  # smallest n that never repeats
    codes = lengths = None
    top: dict[int, int] = {}
    for n in top_ns:
        if size < n:
            continue
        if no_repeat_from is not None and n >= no_repeat_from:
            top[n] = 0
            continue
        if size >= NUMPY_FROM_WORDS and codes is None:
            codes = word_codes(doc_words)
            lengths = np.fromiter(map(len, doc_words), dtype=np.int64, count=size)
        top[n], count = top_ngram(doc_words, n, codes, lengths)
        if count < 2:
            no_repeat_from = n if no_repeat_from is None else min(n, no_repeat_from)
    dup: dict[int, int | None] = {}
    for n in dup_ns:
        if size < n:
            continue
        if no_repeat_from is not None and n >= no_repeat_from:
            dup[n] = None
            continue
        dup[n] = dup_ngram_chars(doc_words, n)
        if dup[n] is None:
            no_repeat_from = n if no_repeat_from is None else min(n, no_repeat_from)
    return top, dup
