"""Document quality filters of the clean step: Gopher quality, C4 line rules, Gopher repetition.

Invariant: every rule is a pure function of the normalized text and its thresholds, and
has one stable name (``gopher_quality.stop_words``, ``c4.curly_bracket`` ...): the clean
step counts each hit under that name, so a filtered document is always explained by a rule.

Counting works for scripts without spaces: :func:`words` splits on whitespace, and every
CJK ideograph, kana or bopomofo character (which Chinese and Japanese write without spaces)
counts as a word of its own. So "50 words" means 50 characters of Song ci poetry, and
n-gram rules run over characters for CJK text. Character fractions are over the characters
of the words (whitespace excluded), so spacing conventions do not move them.

Sources of the rules and defaults:

* :class:`GopherQuality`: Rae et al. 2021, "Scaling Language Models: Methods, Analysis &
  Insights from Training Gopher", Appendix A.1.1 ("quality filtering").
* :class:`GopherRepetition`: same paper, Appendix A.1.2, Table A1 ("repetition removal").
* :class:`C4Lines`: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a
  Unified Text-to-Text Transformer", Section 2.2 ("Colossal Clean Crawled Corpus"), with the
  parameterisation of datatrove's ``C4QualityFilter`` (policy phrases, 5 sentences, 3 words
  per line). The "bad words" list of C4 is not applied (no list ships offline).

C4 line rules *edit* the text (lines are dropped, each drop counted by reason); the other
rules only keep or drop whole documents.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

from tidal.data.repetition import duplicates, ngram_chars, top_ngram, word_codes

# Han (CJK unified + extensions + compatibility), kana, bopomofo, CJK radicals.
_CJK_CHARS = (
    "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3190-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\U00020000-\U0003134f"
)
_WORD_RE = re.compile(f"[{_CJK_CHARS}]|[^\\s{_CJK_CHARS}]+")
_CJK_RE = re.compile(f"[{_CJK_CHARS}]")
_PARAGRAPH_RE = re.compile(r"\n\s*\n")
_BULLETS = ("•", "●", "○", "▪", "◦", "‣", "⁃", "-", "*", "·", "–", "—")
_ELLIPSES = ("...", "…")
# C4 (Raffel et al. 2020): lines must end in terminal punctuation; CJK full stops added.
_TERMINAL = (".", "!", "?", '"', "'", "”", "’", "。", "！", "？", "」", "』", "…")
# Sentence ends: ASCII . ! ? … before whitespace, a closing quote/bracket or the end; CJK
# full stops (written without a following space) wherever they occur.
_SENTENCE_END_RE = re.compile(r"[。！？]+|[.!?…]+(?=[\s\"'”’」』)]|$)")
_CITATION_RE = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
# Gopher's stop words (Rae et al. 2021, App. A.1.1).
GOPHER_STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})


def words(text: str) -> list[str]:
    """Words of ``text``: whitespace-separated runs, with every CJK character a word of its own.

    ``words("Hello, 世界 ok")`` -> ``["Hello,", "世", "界", "ok"]``. Text without CJK characters
    is split by ``str.split()`` (the same whitespace as the regular expression's ``\\s``,
    ``str.isspace``), about 5x faster.
    """
    if text.isascii() or _CJK_RE.search(text) is None:
        return text.split()
    return _WORD_RE.findall(text)


def is_cjk(text: str) -> bool:
    """True when at least half of the non-whitespace characters are CJK (used for shingle units)."""
    chars = sum(1 for ch in text if not ch.isspace())
    return bool(chars) and 2 * len(_CJK_RE.findall(text)) >= chars


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"filter threshold {name!r} must be a number in [0, 1], got {value!r}")
    return float(value)


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"filter threshold {name!r} must be an integer >= 0, got {value!r}")
    return value


def _from_dict(cls, section: str, values: dict[str, Any]):
    """Build a threshold dataclass from a config dict, refusing unknown keys."""
    if not isinstance(values, dict):
        raise ValueError(f"filter section {section!r} must be a mapping, got {values!r}")  # noqa: TRY004
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"filter section {section!r}: unknown key(s) {unknown}; known {sorted(known)}")
    out = {}
    for key, value in values.items():
        default = getattr(cls(), key)
        if isinstance(default, bool):  # before int: bool is an int subclass
            if not isinstance(value, bool):
                raise ValueError(f"filter switch '{section}.{key}' must be true or false, got {value!r}")  # noqa: TRY004
            out[key] = value
        elif isinstance(default, float):
            out[key] = _check_fraction(f"{section}.{key}", value)
        elif isinstance(default, int):
            out[key] = _check_count(f"{section}.{key}", value)
        elif isinstance(default, tuple):
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"filter threshold '{section}.{key}' must be a list, got {value!r}")  # noqa: TRY004
            out[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        else:
            out[key] = value
    return cls(**out)


# ---------------------------------------------------------------- Gopher quality


@dataclass(frozen=True)
class GopherQuality:
    """Gopher document quality rules (Rae et al. 2021, Appendix A.1.1); defaults are the paper's.

    A document is removed when (rule names in brackets):

    * it has fewer than ``min_words`` = 50 or more than ``max_words`` = 100,000 words
      [``too_few_words``, ``too_many_words``];
    * its mean word length is outside [``min_mean_word_length`` = 3, ``max_mean_word_length``
      = 10] characters [``mean_word_length``];
    * the ratio of ``#`` symbols, or of ellipses (``...`` or ``…``), to words exceeds
      ``max_symbol_word_ratio`` = 0.1 [``symbol_word_ratio``];
    * more than ``max_bullet_lines`` = 90 % of its lines start with a bullet point
      [``bullet_lines``];
    * more than ``max_ellipsis_lines`` = 30 % of its lines end with an ellipsis
      [``ellipsis_lines``];
    * fewer than ``min_alpha_words`` = 80 % of its words contain an alphabetic character
      (``str.isalpha``; a CJK ideograph is alphabetic) [``alpha_words``];
    * it contains fewer than ``min_stop_words`` = 2 of the English stop words
      :data:`GOPHER_STOP_WORDS` (counted with repetition, lower-cased) [``stop_words``].
      The stop-word rule is English-only by construction: turn it off (0) for other
      languages.

    Words are :func:`words` (CJK characters count one each).
    """

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines: float = 0.9
    max_ellipsis_lines: float = 0.3
    min_alpha_words: float = 0.8
    min_stop_words: int = 2

    @classmethod
    def from_config(cls, values: dict[str, Any]) -> GopherQuality:
        """Thresholds from a config mapping (missing keys: defaults). Mean word lengths are
        in characters and may exceed 1, so they are checked here rather than as fractions.

        Raises:
            ValueError: naming an unknown key or a value out of range.
        """
        lengths = {k: values[k] for k in ("min_mean_word_length", "max_mean_word_length") if k in values}
        rest = {k: v for k, v in values.items() if k not in lengths}
        base = _from_dict(cls, "gopher_quality", rest)
        for key, value in lengths.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"filter threshold 'gopher_quality.{key}' must be a number >= 0, got {value!r}")
        return cls(**{**base.__dict__, **{k: float(v) for k, v in lengths.items()}})

    def hits(self, text: str, doc_words: list[str]) -> list[str]:
        """Names of the rules ``text`` fails (in the order of the class docstring)."""
        out = []
        n = len(doc_words)
        if n < self.min_words:
            out.append("too_few_words")
        if n > self.max_words:
            out.append("too_many_words")
        if n:
            mean = sum(map(len, doc_words)) / n
            if not self.min_mean_word_length <= mean <= self.max_mean_word_length:
                out.append("mean_word_length")
            hashes = text.count("#")
            ellipses = text.count("...") + text.count("…")
            if max(hashes, ellipses) / n > self.max_symbol_word_ratio:
                out.append("symbol_word_ratio")
        lines = [line for line in text.split("\n") if line.strip()]
        if lines:
            bullets = sum(1 for line in lines if line.lstrip().startswith(_BULLETS))
            if bullets / len(lines) > self.max_bullet_lines:
                out.append("bullet_lines")
            ellipsis_end = sum(1 for line in lines if line.rstrip().endswith(_ELLIPSES))
            if ellipsis_end / len(lines) > self.max_ellipsis_lines:
                out.append("ellipsis_lines")
        counts = Counter(doc_words)  # each distinct word tested once below
        if n and sum(k for w, k in counts.items() if w.isalpha() or any(map(str.isalpha, w))) / n < self.min_alpha_words:
            out.append("alpha_words")
        if self.min_stop_words and sum(k for w, k in counts.items() if w.lower() in GOPHER_STOP_WORDS) < self.min_stop_words:
            out.append("stop_words")
        return out


# ---------------------------------------------------------------- Gopher repetition


@dataclass(frozen=True)
class GopherRepetition:
    """Gopher repetition rules (Rae et al. 2021, Appendix A.1.2, Table A1); defaults are the paper's.

    A document is removed when (rule names in brackets):

    * duplicate lines are more than ``max_dup_line_fraction`` = 0.30 of its lines
      [``dup_line_fraction``], or duplicate paragraphs more than ``max_dup_paragraph_fraction``
      = 0.30 of its paragraphs [``dup_paragraph_fraction``];
    * characters in duplicate lines exceed ``max_dup_line_chars`` = 0.20 of all characters
      [``dup_line_chars``], or in duplicate paragraphs ``max_dup_paragraph_chars`` = 0.20
      [``dup_paragraph_chars``];
    * the most frequent n-gram, for n = 2, 3, 4, covers more than 0.20, 0.18, 0.16 of the
      characters (``top_ngram_chars``) [``top_2gram_chars`` ...];
    * the characters of duplicated n-grams (non-overlapping, each repeat after the first
      occurrence), for n = 5..10, exceed 0.15, 0.14, 0.13, 0.12, 0.11, 0.10
      (``dup_ngram_chars``) [``dup_5gram_chars`` ...].

    "Characters" of lines/paragraphs are their lengths; of n-grams, the lengths of their
    words (whitespace excluded, as in the paper's word-based counting). n-grams are over
    :func:`words`, so for CJK text they are character n-grams. The top n-gram rules apply
    only to documents with at least n words, and a top n-gram that occurs once is not a
    repetition (this follows datatrove's ``GopherRepetitionFilter``).
    """

    max_dup_line_fraction: float = 0.30
    max_dup_paragraph_fraction: float = 0.30
    max_dup_line_chars: float = 0.20
    max_dup_paragraph_chars: float = 0.20
    top_ngram_chars: tuple = ((2, 0.20), (3, 0.18), (4, 0.16))
    dup_ngram_chars: tuple = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))

    @classmethod
    def from_config(cls, values: dict[str, Any]) -> GopherRepetition:
        """Thresholds from a config mapping (missing keys: defaults); n-gram lists are
        ``[[n, fraction], ...]``.

        Raises:
            ValueError: naming an unknown key or a value out of range.
        """
        out = _from_dict(cls, "gopher_repetition", values)
        for key in ("top_ngram_chars", "dup_ngram_chars"):
            for item in getattr(out, key):
                if len(item) != 2 or isinstance(item[0], bool) or not isinstance(item[0], int) or item[0] < 1:
                    raise ValueError(f"filter threshold 'gopher_repetition.{key}' items must be [n >= 1, fraction]")
                _check_fraction(f"gopher_repetition.{key}", item[1])
        return out

    def hits(self, text: str, doc_words: list[str]) -> list[str]:
        """Names of the rules ``text`` fails (in the order of the class docstring)."""
        out = []
        lines = [line for line in text.split("\n") if line.strip()]
        paragraphs = [p for p in _PARAGRAPH_RE.split(text) if p.strip()]
        total_chars = max(len(text), 1)
        line_dups, line_dup_chars = duplicates(lines)
        para_dups, para_dup_chars = duplicates(paragraphs)
        if lines and line_dups / len(lines) > self.max_dup_line_fraction:
            out.append("dup_line_fraction")
        if paragraphs and para_dups / len(paragraphs) > self.max_dup_paragraph_fraction:
            out.append("dup_paragraph_fraction")
        if line_dup_chars / total_chars > self.max_dup_line_chars:
            out.append("dup_line_chars")
        if para_dup_chars / total_chars > self.max_dup_paragraph_chars:
            out.append("dup_paragraph_chars")
        word_chars = sum(map(len, doc_words)) or 1
        top, dup = ngram_chars(doc_words, [n for n, _ in self.top_ngram_chars], [n for n, _ in self.dup_ngram_chars])
        for n, limit in self.top_ngram_chars:
            if n in top and top[n] / word_chars > limit:
                out.append(f"top_{n}gram_chars")
        for n, limit in self.dup_ngram_chars:
            chars = dup.get(n)
            if chars is not None and chars / word_chars > limit:
                out.append(f"dup_{n}gram_chars")
        return out

    def rule_names(self) -> list[str]:
        """Every rule name this configuration can report."""
        return ["dup_line_fraction", "dup_paragraph_fraction", "dup_line_chars", "dup_paragraph_chars",
                *(f"top_{n}gram_chars" for n, _ in self.top_ngram_chars),
                *(f"dup_{n}gram_chars" for n, _ in self.dup_ngram_chars)]


_word_codes = word_codes  # kept under their old names (tests/data/test_filters.py)


def _top_ngram_chars(doc_words: list[str], n: int, codes=None, lengths=None) -> int:
    """Characters covered by the most frequent word n-gram (:func:`tidal.data.repetition.top_ngram`)."""
    return top_ngram(doc_words, n, codes, lengths)[0]


# ---------------------------------------------------------------- C4 lines


@dataclass(frozen=True)
class C4Lines:
    """C4 line and page rules (Raffel et al. 2020, Section 2.2); defaults follow the paper.

    Lines are dropped (each counted under ``c4_line.<reason>``) when they:

    * do not end in terminal punctuation ``. ! ? " '`` (plus ``” ’ 。 ！ ？ 」 』 …`` for
      other scripts) [``no_terminal_punct``], if ``terminal_punct``;
    * have fewer than ``min_words_per_line`` = 3 words [``too_few_words``];
    * contain a word longer than ``max_word_length`` = 1000 characters [``long_word``];
    * contain "javascript" (case-insensitive) [``javascript``], if ``filter_javascript``;
    * contain a cookie/terms policy phrase ("terms of use", "privacy policy", "cookie
      policy", "uses cookies", "use of cookies", "use cookies") [``policy``], if
      ``filter_policy``.

    Citation markers (``[1]``, ``[edit]``, ``[citation needed]``) are removed from lines
    first. The document is then removed when it contains "lorem ipsum" [``lorem_ipsum``],
    a curly bracket ``{`` [``curly_bracket``] (each if enabled), when fewer than
    ``min_sentences`` = 5 sentences remain [``too_few_sentences``; sentence ends are runs of
    ``. ! ? …`` before whitespace, a closing quote or the end, and runs of ``。 ！ ？``
    anywhere], or when no line is left [``no_lines_left``].
    """

    terminal_punct: bool = True
    min_words_per_line: int = 3
    max_word_length: int = 1000
    filter_javascript: bool = True
    filter_policy: bool = True
    filter_lorem_ipsum: bool = True
    filter_curly_bracket: bool = True
    min_sentences: int = 5

    @classmethod
    def from_config(cls, values: dict[str, Any]) -> C4Lines:
        """Thresholds from a config mapping (missing keys: defaults).

        Raises:
            ValueError: naming an unknown key or a value of the wrong type.
        """
        for key, value in values.items():
            if key.startswith(("filter_", "terminal")) and not isinstance(value, bool):
                raise ValueError(f"filter setting 'c4.{key}' must be true or false, got {value!r}")
        return _from_dict(cls, "c4", values)

    def apply(self, text: str, line_drops: Counter) -> tuple[str, list[str]]:
        """Drop bad lines, then check the page rules.

        Returns:
            ``(kept_text, hits)``: the text of the kept lines joined by ``\\n`` and the names
            of the document rules it fails. ``line_drops`` receives ``reason -> lines``.
        """
        kept = []
        for line in text.split("\n"):
            line = (_CITATION_RE.sub("", line) if "[" in line else line).strip()  # every marker has "["
            if not line:
                continue
            if self.terminal_punct and not line.endswith(_TERMINAL):
                line_drops["no_terminal_punct"] += 1
                continue
            line_words = words(line)
            lowered = line.lower()
            if len(line_words) < self.min_words_per_line:
                line_drops["too_few_words"] += 1
            elif len(line) > self.max_word_length and any(len(w) > self.max_word_length for w in line_words):
                line_drops["long_word"] += 1
            elif self.filter_javascript and "javascript" in lowered:
                line_drops["javascript"] += 1
            elif self.filter_policy and any(p in lowered for p in _POLICY):
                line_drops["policy"] += 1
            else:
                kept.append(line)
        out = "\n".join(kept)
        hits = []
        lowered = text.lower()
        if self.filter_lorem_ipsum and "lorem ipsum" in lowered:
            hits.append("lorem_ipsum")
        if self.filter_curly_bracket and "{" in text:
            hits.append("curly_bracket")
        if not kept:
            hits.append("no_lines_left")
        elif len(_SENTENCE_END_RE.findall(out)) < self.min_sentences:
            hits.append("too_few_sentences")
        return out, hits


C4_RULES = ("lorem_ipsum", "curly_bracket", "no_lines_left", "too_few_sentences")
GOPHER_QUALITY_RULES = ("too_few_words", "too_many_words", "mean_word_length", "symbol_word_ratio",
                        "bullet_lines", "ellipsis_lines", "alpha_words", "stop_words")
SECTIONS = ("c4", "gopher_repetition", "gopher_quality")


@dataclass(frozen=True)
class QualityFilters:
    """The enabled quality filters of one source (``None``: that filter is off).

    Applied in the order C4 lines (which edits the text), Gopher repetition, Gopher
    quality; every rule of every enabled filter is evaluated so each rule's hit rate is
    known, and the first hit in that order is the reason a document is filtered.
    """

    c4: C4Lines | None = None
    gopher_repetition: GopherRepetition | None = None
    gopher_quality: GopherQuality | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> QualityFilters:
        """From ``{"c4": {...} | None, "gopher_repetition": ..., "gopher_quality": ...}``;
        a missing or ``None`` section is off, ``{}`` is on with the defaults.

        Raises:
            ValueError: naming an unknown section or key, or a bad threshold.
        """
        config = config or {}
        unknown = sorted(set(config) - set(SECTIONS))
        if unknown:
            raise ValueError(f"filters: unknown section(s) {unknown}; known {list(SECTIONS)}")
        build = {"c4": C4Lines, "gopher_repetition": GopherRepetition, "gopher_quality": GopherQuality}
        return cls(**{k: build[k].from_config(v) for k, v in config.items() if v is not None})

    def rule_names(self) -> list[str]:
        """Every ``section.rule`` name the enabled filters can report, in check order."""
        names = [f"c4.{r}" for r in C4_RULES] if self.c4 else []
        if self.gopher_repetition:
            names += [f"gopher_repetition.{r}" for r in self.gopher_repetition.rule_names()]
        if self.gopher_quality:
            names += [f"gopher_quality.{r}" for r in GOPHER_QUALITY_RULES]
        return names

    def apply(self, text: str, line_drops: Counter) -> tuple[str, list[str]]:
        """Run the enabled filters on ``text``.

        Returns:
            ``(text, hits)``: the text after C4 line removal (unchanged when C4 is off) and
            every failed rule as ``section.rule``, in check order (empty: the document stays).
            ``line_drops`` receives C4's dropped-line counts by reason.
        """
        hits: list[str] = []
        if self.c4 is not None:
            text, c4_hits = self.c4.apply(text, line_drops)
            hits += [f"c4.{h}" for h in c4_hits]
        doc_words = words(text) if (self.gopher_repetition or self.gopher_quality) else []
        if self.gopher_repetition is not None:
            hits += [f"gopher_repetition.{h}" for h in self.gopher_repetition.hits(text, doc_words)]
        if self.gopher_quality is not None:
            hits += [f"gopher_quality.{h}" for h in self.gopher_quality.hits(text, doc_words)]
        return text, hits
