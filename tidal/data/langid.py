"""Language identification for the clean step, offline, with py3langid's bundled model.

Invariant: the language of a document is a pure function of its normalized text and the
pinned py3langid model (Lui & Baldwin 2012, "langid.py: An Off-the-shelf Language
Identification Tool", ACL; the pinned py3langid model knows 142 languages, ISO 639-1 codes where
one exists, else ISO 639-3 such as ``wuu`` (Wu Chinese); the model ships inside the PyPI
wheel, nothing is downloaded). Confidence is the normalized posterior probability in [0, 1]
(``norm_probs=True``), rounded to 4 decimals so tiny float differences between machines
cannot flip a threshold decision or change the output bytes.

Rules (counted by the clean step): ``language.not_allowed`` (the detected language is not
in the source's ``allowed`` list) and ``language.low_confidence`` (below
``min_confidence``). With ``allowed`` unset the language is only recorded for the stats.

Speed: :func:`identify` computes py3langid's posterior itself (:func:`_scores`, the same
float32 operations in the same order, so the same bits: ``tests/data/test_langid.py``), with
two shortcuts: the byte DFA is walked for all bytes at once with numpy for texts of
:data:`VECTOR_FROM_BYTES` bytes or more (:func:`_feature_counts`), and the model's float16
feature rows are converted to float32 once per process rather than per text
(:class:`_Float32Rows`). About 1.4x faster than ``classify`` on the data bench's records.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache
from typing import Annotated

import numpy as np
from pydantic import Field

from tidal.config import Fraction, Strict

# langid reads at most this many characters: the posterior of a naive-Bayes byte n-gram
# model saturates within a few hundred characters (Brown: 1.0 either way), and langid costs
# about 5 us per character, so a 50 MB one-line document must not be read whole.
MAX_CHARS = 2_000
LANGUAGE_RULES = ("not_allowed", "low_confidence")
# From this many UTF-8 bytes on, the DFA walk is vectorised (:func:`_feature_counts`); below,
# py3langid's own Python loop is cheaper than numpy's per-call overhead.
VECTOR_FROM_BYTES = 250


@lru_cache(maxsize=1)
def _identifier():
    """The py3langid identifier with normalized probabilities (loaded once per process, ~0.6 s)."""
    from py3langid import langid
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_modelpath(langid.MODEL_DIR / MODEL_FILE, norm_probs=True)


@lru_cache(maxsize=1)
def _scanner() -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """py3langid's byte DFA as numpy arrays: ``(nextmove uint32, rowbase int64, output int64,
    depth)``. ``nextmove`` is a view of the identifier's table (no copy); ``depth`` is the
    longest shortest path from the start state, 6 for the pinned model, found by a
    breadth-first search over distinct transition rows (~0.2 s, once per process).

    The DFA is an Aho-Corasick automaton over byte n-grams, so its state after any text is its
    state after the text's last ``depth`` bytes read from the start
    (``tests/data/test_langid.py`` proves this for the installed model, pair by pair of states).
    """
    ident = _identifier()
    nextmove = np.frombuffer(ident.tk_nextmove, dtype=np.uint32)
    rowbase = np.asarray(ident._rowbase, dtype=np.int64)
    rows = nextmove.reshape(-1, 256)
    seen = np.zeros(rowbase.size, dtype=bool)
    seen[0] = True
    frontier, depth = np.zeros(1, dtype=np.int64), 0
    while True:
        reached = rows[np.unique(rowbase[frontier] >> 8)].ravel()
        fresh = reached[~seen[reached]]
        if not fresh.size:
            break
        seen[fresh] = True
        frontier, depth = np.unique(fresh).astype(np.int64), depth + 1
    return nextmove, rowbase, np.asarray(ident.tk_output, dtype=np.int64), depth


def _feature_counts(encoded: bytes) -> tuple[np.ndarray, np.ndarray]:
    """py3langid's ``visit_counts`` vectorised: ``(features intp, counts float32)`` in order
    of first occurrence (the order ``visit_counts``' ``Counter`` has, so the scores' float
    sums are the same), from the DFA state at every byte, found for all bytes at once by
    reading each byte's last ``depth`` bytes from the start state (:func:`_scanner`)."""
    nextmove, rowbase, output, depth = _scanner()
    data = np.frombuffer(encoded, dtype=np.uint8).astype(np.int64)
    states = np.zeros(data.size, dtype=np.int64)
    for lag in range(min(depth, data.size) - 1, -1, -1):  # byte i - lag moves every state i >= lag
        states[lag:] = nextmove[rowbase[states[lag:]] + data[: data.size - lag]]
    found = output[states]
    found = found[found >= 0]
    features, first, counts = np.unique(found, return_index=True, return_counts=True)
    order = np.argsort(first)
    return features[order].astype(np.intp), counts[order].astype(np.float32)


class _Float32Rows:
    """Rows of py3langid's float16 feature table, each converted to float32 once per process.

    py3langid scores ``log1p(counts) @ table[features]``; numpy converts the gathered float16
    rows to float32 inside that product (about 2 ns a value, most of a short text's cost), and
    the product itself runs in float32. Gathering already converted rows gives the same float32
    matrix, so the same product and bits. Memory: 568 bytes a feature seen, at most the whole
    table (100,053 x 142 float32, 57 MB). Thread-safe (one lock).
    """

    def __init__(self, table: np.ndarray):
        self.table = table
        self.slot = np.full(table.shape[0], -1, dtype=np.int64)  # feature -> row of self.rows
        self.rows = np.empty((0, table.shape[1]), dtype=np.float32)
        self.size = 0
        self.lock = threading.Lock()

    def gather(self, features: np.ndarray) -> np.ndarray:
        """``float32[len(features), classes]``: ``table[features]`` converted (``features`` distinct)."""
        with self.lock:
            slots = self.slot[features]
            missing = slots < 0
            if missing.any():
                new = features[missing]
                if self.size + new.size > len(self.rows):
                    grown = np.empty((min(max(2 * len(self.rows), self.size + new.size, 4096), len(self.table)),
                                      self.table.shape[1]), dtype=np.float32)
                    grown[: self.size] = self.rows[: self.size]
                    self.rows = grown
                self.rows[self.size : self.size + new.size] = self.table[new]
                self.slot[new] = np.arange(self.size, self.size + new.size)
                self.size += new.size
                slots = self.slot[features]
            return self.rows[slots]


@lru_cache(maxsize=1)
def _float32_rows() -> _Float32Rows:
    return _Float32Rows(_identifier().nb_ptc)


def _scores(ident, encoded: bytes) -> np.ndarray:
    """py3langid's ``LanguageIdentifier._decide`` (py3langid 0.4.0, as locked; ``norm_probs=True``,
    no ``min_confidence``) on already encoded text:
    the Python DFA walk for short texts, :func:`_feature_counts` from :data:`VECTOR_FROM_BYTES`
    bytes, then the same float32 operations in the same order (feature rows from
    :class:`_Float32Rows`)."""
    if len(encoded) < VECTOR_FROM_BYTES:
        from py3langid.langid import visit_counts

        visits = visit_counts(ident.tk_nextmove, ident._rowbase, ident.tk_output, encoded) or {}
        features = np.fromiter(visits.keys(), dtype=np.intp, count=len(visits))
        counts = np.fromiter(visits.values(), dtype=np.float32, count=len(visits))
    else:
        features, counts = _feature_counts(encoded)
    if features.size:
        scores = np.log1p(counts) @ _float32_rows().gather(features) + ident.nb_pc
    else:  # no features: 0.0 under norm_probs
        scores = np.full(len(ident.nb_classes), 0.0, dtype=np.float32)
    scores *= 1.0 / math.sqrt(len(encoded) or 1)
    np.exp(scores - scores.max(), out=scores)
    scores /= scores.sum()
    for i, j in ident._alias_pairs:
        scores[i] += scores[j]
        scores[j] = 0.0
    return scores


def identify(text: str) -> tuple[str, float]:
    """``(language code, confidence in [0, 1])`` of ``text`` (first :data:`MAX_CHARS` characters).

    Text without any letter gets ``("und", 0.0)`` (undetermined, ISO 639-2). Same result as
    py3langid's ``classify`` (``tests/data/test_langid.py``), computed by :func:`_scores`.
    """
    sample = text[:MAX_CHARS]
    if not any(ch.isalpha() for ch in sample):
        return "und", 0.0
    ident = _identifier()
    scores = _scores(ident, ident._encode(sample))
    best = int(scores.argmax())
    return str(ident.nb_classes[best]), round(float(scores[best]), 4)


class LanguageFilter(Strict):
    """Allowed languages of one source and the minimum confidence: a source's ``language`` in
    the recipe and the clean step config's ``language``."""

    allowed: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None, description="ISO 639-1 codes (else ISO 639-3) to keep; null keeps all (identify only)"
    )
    min_confidence: Fraction = Field(
        default=0.0, description="drop documents identified with less confidence; py3langid gives short "
        "classical Chinese poems about 0.5, English prose 0.98+"
    )

    def check(self, lang: str, confidence: float) -> str | None:
        """The failed rule (``not_allowed`` / ``low_confidence``) or ``None``."""
        if self.allowed and lang not in self.allowed:
            return "not_allowed"
        if confidence < self.min_confidence:
            return "low_confidence"
        return None
