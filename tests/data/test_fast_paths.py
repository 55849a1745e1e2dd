"""The clean step's fast paths against the straightforward code they replaced, on random texts
built from the characters each shortcut depends on (whitespace kinds, controls, CJK, astral
letters, repeated words): same normalized text and steps, letter fraction, words and filter
hits, for both the Counter and the numpy n-gram paths."""

from __future__ import annotations

import random
import re
import unicodedata
from collections import Counter

import pytest

from tidal.data import normalize, repetition
from tidal.data.filters import (
    _CJK_CHARS,
    C4Lines,
    GopherQuality,
    GopherRepetition,
    QualityFilters,
    words,
)

PIECES = ["abc", "XYZ", " ", "  ", "\t", "\n", "\n\n", " \n", "\t\n", "\r\n", "\r", "\x1b[31m", "\x1b]0;t\x07",
          "\x9b2J", "\x00", "\x7f", "\x85", "\xa0", "\u2028", "\u2029", "\u3000", "\u200a", "\ufeff", "e\u0301",
          "é", "क", "ि", "春", "风", "。", "𠀀", "𝐀", "😀", "\ud800", "ﬁ", "½", "the", "of", "and", "...", "#"]


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 60))) for _ in range(n)]


def _old_normalize_steps(text: str, form: str) -> tuple[str, list[str]]:
    steps = []
    if text.startswith("\ufeff"):
        text, steps = text[1:], ["bom"]
    for name, step in (("ansi", normalize.strip_ansi), ("newlines", normalize.normalize_newlines),
                       ("unicode_form", lambda t: unicodedata.normalize(form, t)),
                       ("controls", normalize.strip_controls)):
        changed = step(text)
        if changed != text:
            steps.append(name)
        text = changed
    return re.sub(r"[^\S\n]+$", "", text, flags=re.MULTILINE).strip(), steps


def _old_letter_fraction(text: str) -> float:
    letters = total = 0
    for ch, n in Counter(text).items():
        if not ch.isspace():
            total += n
            letters += n if unicodedata.category(ch)[0] in "LM" else 0
    return letters / total if total else 0.0


@pytest.mark.parametrize("form", ["NFC", "NFKC"])
def test_normalize_and_letter_fraction_equal_the_plain_passes(form):
    for text in _texts(4000, seed=len(form)) + ["", "plain ascii", "trailing \nspace\t", "𠀀 𠀁"]:
        assert normalize.normalize_text_steps(text, form) == _old_normalize_steps(text, form), repr(text)
        assert normalize.letter_fraction(text) == _old_letter_fraction(text), repr(text)


def test_words_split_equals_the_regex():
    regex = re.compile(f"[{_CJK_CHARS}]|[^\\s{_CJK_CHARS}]+")
    for text in _texts(4000, seed=5):
        assert words(text) == regex.findall(text), repr(text)


def _old_repetition_hits(rule: GopherRepetition, text: str, doc_words: list[str]) -> list[str]:
    """GopherRepetition.hits before the shortcuts: every n-gram count computed, by Counter."""
    out = []
    lines = [line for line in text.split("\n") if line.strip()]
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    total = max(len(text), 1)

    def dups(items):
        seen, count, chars = set(), 0, 0
        for item in items:
            if item in seen:
                count, chars = count + 1, chars + len(item)
            seen.add(item)
        return count, chars

    (ld, lc), (pd, pc) = dups(lines), dups(paragraphs)
    for hit, value, limit in (("dup_line_fraction", ld / max(len(lines), 1), rule.max_dup_line_fraction),
                              ("dup_paragraph_fraction", pd / max(len(paragraphs), 1), rule.max_dup_paragraph_fraction),
                              ("dup_line_chars", lc / total, rule.max_dup_line_chars),
                              ("dup_paragraph_chars", pc / total, rule.max_dup_paragraph_chars)):
        if value > limit:
            out.append(hit)
    word_chars = sum(map(len, doc_words)) or 1
    for n, limit in rule.top_ngram_chars:
        if len(doc_words) >= n:
            gram, count = Counter(zip(*(doc_words[k:] for k in range(n)))).most_common(1)[0]
            if (sum(map(len, gram)) * count if count > 1 else 0) / word_chars > limit:
                out.append(f"top_{n}gram_chars")
    for n, limit in rule.dup_ngram_chars:
        if len(doc_words) >= n:
            chars = repetition.dup_ngram_chars(doc_words, n)
            if chars is not None and chars / word_chars > limit:
                out.append(f"dup_{n}gram_chars")
    return out


def _repetitive_docs(seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = ["a", "bb", "the", "of", "ccc", "x" * 9, "春", "风", "。", "end.", "\n", "\n\n"]
    docs = []
    for size in (2, 5, 30, 120, 450, 1200):
        for _ in range(40):
            v = rng.sample(vocab, rng.randint(2, len(vocab)))
            docs.append(" ".join(rng.choice(v) for _ in range(rng.randint(0, size))))
    docs += [" ".join(f"w{i}" for i in range(500)), "one two one two one two " * 80]
    return docs


@pytest.mark.parametrize("numpy_from", [0, 400, 10**9])
def test_repetition_shortcuts_equal_every_count(monkeypatch, numpy_from):
    """The no-repeat shortcut and both top n-gram paths give the hits of counting everything."""
    monkeypatch.setattr(repetition, "NUMPY_FROM_WORDS", numpy_from)
    rules = [GopherRepetition(),
             GopherRepetition(top_ngram_chars=((1, 0.05), (4, 0.0), (2, 0.1), (3, 0.0)),
                              dup_ngram_chars=((2, 0.0), (7, 0.01), (3, 0.0), (5, 0.0))),
             GopherRepetition(top_ngram_chars=((6, 0.0), (2, 0.0)), dup_ngram_chars=((1, 0.0), (10, 0.0)))]
    for text in _repetitive_docs(seed=numpy_from % 89):
        doc_words = words(text)
        for rule in rules:
            assert rule.hits(text, doc_words) == _old_repetition_hits(rule, text, doc_words), (text[:80], rule)


def test_quality_and_c4_rules_on_edge_lines():
    """The lazily computed line checks (terminal punctuation first, citation markers only
    with "[", long words only in long lines) and the per-distinct-word quality counts."""
    c4 = C4Lines(max_word_length=12)
    drops: Counter = Counter()
    text = ("Short line here.\nno end\nA veryveryverylongword here.\nSee [1] the javascript page.\n"
            "It has [edit] three words.\nTwo words.")
    kept, hits = c4.apply(text, drops)
    assert kept == "Short line here.\nIt has  three words."
    assert drops == {"no_terminal_punct": 1, "long_word": 1, "javascript": 1, "too_few_words": 1}
    assert hits == ["too_few_sentences"]
    prose = " ".join(["The", "cat", "and", "THE", "dog", "with", "1234", "½½½½", "stone"] * 8)
    assert GopherQuality().hits(prose, words(prose)) == ["alpha_words"]  # 7 of 9 words have a letter
    assert GopherQuality(min_stop_words=33).hits(prose, words(prose)) == ["alpha_words", "stop_words"]  # 32 stop words
    assert GopherQuality(min_stop_words=32).hits(prose, words(prose)) == ["alpha_words"]
    assert QualityFilters(c4=C4Lines(), gopher_quality=GopherQuality()).apply("", Counter())[1] == [
        "c4.no_lines_left", "gopher_quality.too_few_words", "gopher_quality.stop_words"]
