"""tidal.data.langid's own scoring path against py3langid's classify, bit for bit, and the DFA
property its vectorised walk rests on, proved for the installed model."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tidal.data import langid

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 40,
    "Alle Menschen sind frei und gleich an Würde und Rechten geboren.",
    "Tous les êtres humains naissent libres et égaux en dignité et en droits. " * 10,
    "春风又绿江南岸，明月何时照我还。" * 30,
    "Все люди рождаются свободными и равными в своем достоинстве и правах.",
    "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता प्राप्त है।" * 5,
    "كل إنسان له حق التمتع بكافة الحقوق والحريات",
    "ÉCOLE NORMALE SUPÉRIEURE",  # all upper case: py3langid lower-cases it
    "a", "x1", "𠀀𠀁 emoji 😀 mix", "e\u0301te\u0301",  # NFD input: py3langid composes it
]


def _random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces = (list("abcdefghijklmnop qrstuvwxyz\n.,;")
              + ["春", "风", "é", "ж", "ק", "ب", "क", "ि", "😀", "ÀB", "the ", "der "])
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 2600))) for _ in range(n)]


@pytest.mark.parametrize("vector_from", [0, 250, 10**9])
def test_scores_equal_py3langid_bit_for_bit(monkeypatch, vector_from):
    """Both walks (Python loop below the threshold, vectorised from it) and the float32 row
    cache give exactly py3langid's posterior vector, so the label and confidence match."""
    monkeypatch.setattr(langid, "VECTOR_FROM_BYTES", vector_from)
    ident = langid._identifier()
    for text in TEXTS + _random_texts(150, seed=vector_from % 97):
        sample = text[: langid.MAX_CHARS]
        expected = ident._decide(sample)
        got = langid._scores(ident, ident._encode(sample))
        np.testing.assert_array_equal(got, expected, err_msg=repr(sample[:60]))
        lang, prob = ident.classify(sample)
        if any(ch.isalpha() for ch in sample):
            assert langid.identify(text) == (lang, round(float(prob), 4))


def test_identify_without_letters_is_undetermined():
    assert langid.identify("12345 !!! ...") == ("und", 0.0)
    assert langid.identify("") == ("und", 0.0)


def test_dfa_state_depends_on_last_depth_bytes_only():
    """For every state q and every byte string u of ``depth`` bytes, the DFA ends in the same
    state from q as from the start state: the pairs (state from q, state from start) reachable
    by ``depth`` bytes are all equal. This is what lets ``_feature_counts`` find each byte's
    state from its last ``depth`` bytes alone."""
    nextmove, rowbase, _, depth = langid._scanner()
    rows = nextmove.reshape(-1, 256)
    row = rowbase >> 8
    n_states = rowbase.size
    left, right = np.arange(n_states, dtype=np.int64), np.zeros(n_states, dtype=np.int64)
    for _ in range(depth):
        pairs = []
        for lo in range(0, left.size, 20_000):
            a = rows[row[left[lo : lo + 20_000]]].astype(np.int64)
            b = rows[row[right[lo : lo + 20_000]]].astype(np.int64)
            differ = a != b
            pairs.append(np.unique(a[differ] * n_states + b[differ]))
        merged = np.unique(np.concatenate(pairs))
        left, right = merged // n_states, merged % n_states
    assert left.size == 0, f"{left.size} state pairs still differ after {depth} bytes"
    assert depth == 6  # the pinned model: byte n-grams up to 6 bytes deep


def test_float32_rows_are_the_table_rows():
    ident = langid._identifier()
    rows = langid._Float32Rows(ident.nb_ptc)
    rng = np.random.default_rng(0)
    for _ in range(20):
        features = rng.choice(ident.nb_ptc.shape[0], size=rng.integers(1, 3000), replace=False)
        np.testing.assert_array_equal(rows.gather(features), ident.nb_ptc[features].astype(np.float32))
    assert rows.size <= ident.nb_ptc.shape[0] and len(rows.rows) <= ident.nb_ptc.shape[0]
