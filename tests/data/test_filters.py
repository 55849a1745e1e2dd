"""Quality filters: each Gopher / C4 / repetition rule fires on a text built to break it, and only then."""

from __future__ import annotations

from collections import Counter

import pytest
from pydantic import ValidationError

from tidal.data.filters import (
    C4Lines,
    GopherQuality,
    GopherRepetition,
    QualityFilters,
    is_cjk,
    words,
)

# 60 distinct words of ordinary English with enough stop words; no repetition anywhere.
PROSE_WORDS = ["the", "river", "runs", "past", "old", "mills", "and", "that", "town", "where", "farmers", "bring",
               "grain", "to", "market", "with", "carts", "while", "children", "watch", "boats", "drift", "under",
               "stone", "bridges", "built", "of", "granite", "during", "long", "summers", "when", "merchants", "have",
               "traded", "wool", "cloth", "silver", "spices", "timber", "salt", "horses", "copper", "glass", "amber",
               "pottery", "wine", "honey", "leather", "grain"]
PROSE = " ".join(PROSE_WORDS[:60]) + "."


def quality_hits(text: str, **overrides) -> list[str]:
    return GopherQuality.model_validate(overrides).hits(text, words(text))


def repetition_hits(text: str, **overrides) -> list[str]:
    return GopherRepetition.model_validate(overrides).hits(text, words(text))


def test_words_split_cjk_by_character():
    assert words("Hello, 世界 ok") == ["Hello,", "世", "界", "ok"]
    assert words("春风又绿江南岸，明月何时照我还。") [:4] == ["春", "风", "又", "绿"]
    assert is_cjk("春风又绿江南岸") and not is_cjk("spring wind 春")


def test_gopher_quality_passes_prose():
    assert quality_hits(PROSE) == []


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        (" ".join(PROSE_WORDS[:30]), "too_few_words"),
        (PROSE + " and" * 100_000, "too_many_words"),
        (" ".join(["a", "to", "of", "be"] * 20), "mean_word_length"),
        (" ".join(["extraordinarilylongwords"] * 60) + " the and", "mean_word_length"),
        (PROSE + " #tag" * 7, "symbol_word_ratio"),
        (PROSE + " ..." * 7, "symbol_word_ratio"),
        ("\n".join(f"- {w} river and the mill" for w in PROSE_WORDS[:20]), "bullet_lines"),
        ("\n".join(f"{w} the river and the mill..." for w in PROSE_WORDS[:20]), "ellipsis_lines"),
        (PROSE + " " + " ".join(str(1000 + i) for i in range(20)), "alpha_words"),
        (" ".join(w for w in PROSE_WORDS if w not in ("the", "and", "that", "to", "with", "have")), "stop_words"),
    ],
)
def test_gopher_quality_rule_fires(text, rule):
    assert rule in quality_hits(text)


def test_gopher_quality_thresholds_are_configurable_and_checked():
    short = " ".join(PROSE_WORDS[:30])
    assert "too_few_words" not in quality_hits(short, min_words=20)
    assert quality_hits("春风又绿江南岸" * 10, min_stop_words=0, min_mean_word_length=1) == []
    with pytest.raises(ValidationError, match="min_wrds\n  Extra inputs are not permitted"):
        GopherQuality.model_validate({"min_wrds": 3})
    with pytest.raises(ValidationError, match="max_bullet_lines"):
        GopherQuality.model_validate({"max_bullet_lines": 1.5})
    with pytest.raises(ValidationError, match="min_words"):
        GopherQuality.model_validate({"min_words": True})
    with pytest.raises(ValidationError, match="top_ngram_chars.0.0"):
        GopherRepetition.model_validate({"top_ngram_chars": [[0, 0.2]]})


def test_a_section_dumps_the_thresholds_it_sets_as_written():
    """The hashed form of the filters: set keys only, an integer kept an integer (step ids)."""
    filters = QualityFilters.model_validate({"c4": {}, "gopher_quality": {"max_mean_word_length": 12},
                                             "gopher_repetition": {"top_ngram_chars": [[2, 0]]}})
    assert filters.gopher_quality.max_mean_word_length == 12 and filters.gopher_quality.min_words == 50
    assert filters.model_dump() == {"c4": {}, "gopher_repetition": {"top_ngram_chars": [[2, 0]]},
                                    "gopher_quality": {"max_mean_word_length": 12}}
    assert QualityFilters().model_dump() == {"c4": None, "gopher_repetition": None, "gopher_quality": None}
    own = QualityFilters.model_validate({"c4": None})
    assert filters.overridden_by(own).model_dump()["c4"] is None
    assert filters.overridden_by(None) is filters


def test_gopher_counts_cjk_words_by_character():
    poem = "春风又绿江南岸明月何时照我还" * 3  # 42 characters = 42 words
    assert len(words(poem)) == 42
    assert "too_few_words" in quality_hits(poem)
    assert "too_few_words" not in quality_hits(poem * 2)


def test_repetition_passes_prose():
    assert repetition_hits(PROSE) == []


def test_repetition_line_and_paragraph_rules():
    lines = [" ".join(PROSE_WORDS[i : i + 6]) for i in range(0, 42, 6)]  # 7 distinct lines
    dup_lines = "\n".join(lines + [lines[0]] * 4)  # 4 of 11 lines repeat (0.36 > 0.30)
    hits = repetition_hits(dup_lines)
    assert "dup_line_fraction" in hits and "dup_line_chars" in hits
    paragraphs = "\n\n".join(lines + [lines[1]] * 4)
    assert {"dup_paragraph_fraction", "dup_paragraph_chars"} <= set(repetition_hits(paragraphs))


def test_repetition_top_ngram_and_duplicate_ngram_rules():
    top2 = PROSE + " " + " ".join(["old mills"] * 8)  # "old mills" x9 covers > 20 % of word chars
    assert "top_2gram_chars" in repetition_hits(top2)
    repeated = " ".join(PROSE_WORDS[:12]) + " " + " ".join(PROSE_WORDS[:12]) + " " + " ".join(PROSE_WORDS[12:40])
    hits = repetition_hits(repeated)
    assert "dup_5gram_chars" in hits and "dup_10gram_chars" in hits


def test_repetition_counts_cjk_ngrams_by_character():
    poem = "春风又绿江南岸明月何时照我还" + "千山鸟飞绝万径人踪灭"
    assert repetition_hits(poem) == []
    refrain = poem + "明月何时照我还" * 3  # a 7-character refrain: 4-grams and 5-grams repeat
    hits = repetition_hits(refrain)
    assert "top_4gram_chars" in hits and "dup_5gram_chars" in hits


def test_c4_drops_lines_and_counts_them_by_reason():
    good = [f"{' '.join(PROSE_WORDS[i : i + 8])}." for i in range(0, 48, 8)]  # 6 sentences
    text = "\n".join([good[0], "Menu", "Home page with no end", good[1], "Enable JavaScript to view this site.",
                      "This site uses cookies for analytics.", good[2], "See also [1] the river.", *good[3:]])
    drops: Counter = Counter()
    kept, hits = C4Lines().apply(text, drops)
    assert drops == Counter({"no_terminal_punct": 2, "javascript": 1, "policy": 1})
    assert "See also  the river." in kept.split("\n")  # citation marker removed (as datatrove), line kept
    assert "Menu" not in kept and hits == []


def test_c4_page_rules():
    good = "\n".join(f"{' '.join(PROSE_WORDS[i : i + 8])}." for i in range(0, 48, 8))
    assert C4Lines().apply(good + "\nLorem ipsum dolor sit amet.", Counter())[1] == ["lorem_ipsum"]
    assert C4Lines().apply(good + "\nThe set {a, b} is small.", Counter())[1] == ["curly_bracket"]
    assert C4Lines().apply("One sentence only here.", Counter())[1] == ["too_few_sentences"]
    assert C4Lines().apply("no punctuation\nat all", Counter())[1] == ["no_lines_left"]
    drops: Counter = Counter()
    assert C4Lines().apply("ok ok.", drops)[1] == ["no_lines_left"] and drops == {"too_few_words": 1}
    assert C4Lines(min_sentences=1).apply("Only one sentence here.", Counter())[1] == []


def test_c4_accepts_cjk_terminal_punctuation():
    poem = "春风又绿江南岸。\n明月何时照我还！\n千山鸟飞绝。\n万径人踪灭？\n孤舟蓑笠翁。"
    kept, hits = C4Lines().apply(poem, Counter())
    assert kept == poem and hits == []


def test_quality_filters_sections_order_and_names():
    filters = QualityFilters.model_validate({"c4": {}, "gopher_repetition": None, "gopher_quality": {"min_words": 5}})
    assert filters.gopher_repetition is None
    assert filters.rule_names()[0] == "c4.lorem_ipsum" and "gopher_quality.stop_words" in filters.rule_names()
    _text, hits = filters.apply("Lorem ipsum dolor sit amet.\n" + PROSE, Counter())
    assert hits[0] == "c4.lorem_ipsum"
    assert QualityFilters().apply(PROSE, Counter()) == (PROSE, [])
    with pytest.raises(ValidationError, match="gopher\n  Extra inputs are not permitted"):
        QualityFilters.model_validate({"gopher": {}})


def test_c4_counts_cjk_sentences_without_spaces():
    assert C4Lines().apply("春风又绿江南岸。明月何时照我还！千山鸟飞绝。万径人踪灭？孤舟蓑笠翁。", Counter())[1] == []
    assert C4Lines().apply("春风又绿江南岸。明月何时照我还。", Counter())[1] == ["too_few_sentences"]


def test_top_ngram_chars_numpy_path_equals_counter_path():
    """The packed-int64 count (tidal.data.filters._top_ngram_chars with codes) against the
    Counter of tuples, on documents built to have many ties between different-length n-grams."""
    import random

    import numpy as np

    from tidal.data.filters import _top_ngram_chars, _word_codes

    rng = random.Random(11)
    vocab = ["a", "bb", "ccc", "dddd", "the", "of", "x" * 9, "春", "风"]
    docs = [[rng.choice(vocab) for _ in range(rng.randint(1, 60))] for _ in range(300)]
    docs += [["w1", "w2"] * 3 + ["w3", "w4"] * 3, ["z"] * 7, ["p", "q"], [f"u{i}" for i in range(40)]]
    for doc in docs:
        codes = _word_codes(doc)
        lengths = np.fromiter(map(len, doc), dtype=np.int64, count=len(doc))
        for n in (1, 2, 3, 4):
            if len(doc) >= n:
                assert _top_ngram_chars(doc, n, codes, lengths) == _top_ngram_chars(doc, n), (doc, n)


def test_c4_switches_take_booleans_from_the_recipe():
    from tidal.data.filters import QualityFilters

    drops: Counter = Counter()
    text = ("Enable JavaScript to view this site.\n"
            + "\n".join(f"{' '.join(PROSE_WORDS[i : i + 8])}." for i in range(0, 48, 8)))
    off = QualityFilters.model_validate({"c4": {"filter_javascript": False, "terminal_punct": False}})
    kept, _ = off.apply(text, drops)
    assert "Enable JavaScript to view this site." in kept and drops["javascript"] == 0
    with pytest.raises(ValidationError, match="c4.filter_javascript\n  Input should be a valid boolean"):
        QualityFilters.model_validate({"c4": {"filter_javascript": 0}})
