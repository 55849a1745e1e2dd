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

Each filter's thresholds are a strict config model, and :class:`QualityFilters` (the three
sections) is the ``filters`` of the recipe's ``clean`` section, of a source, and of the clean
step config alike: the recipe validates it, the planner hashes its dump, the step reads it back.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Annotated, Any

from pydantic import Field, PlainSerializer, WrapValidator, model_serializer
from pydantic import Strict as StrictType

from tidal.config import Strict
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


def _as_written(value: Any, handler: Any) -> Any:
    """Check a threshold as a strict number (no bool, no string) and keep an integer an integer."""
    checked = handler(value)
    return value if type(value) is int else checked


# Thresholds: a fraction (of words, lines or characters), a length in characters, a count, a
# switch. A number is kept and dumped as the recipe wrote it: the hashed config holds ``10`` for
# ``10`` and ``10.0`` for ``10.0`` (different JSON, so different step ids), as it always has.
_DUMP_AS_WRITTEN = PlainSerializer(lambda value: value, return_type=Any)
Ratio = Annotated[float, StrictType(), Field(ge=0.0, le=1.0), WrapValidator(_as_written), _DUMP_AS_WRITTEN]
Length = Annotated[float, StrictType(), Field(ge=0.0), WrapValidator(_as_written), _DUMP_AS_WRITTEN]
Count = Annotated[int, StrictType(), Field(ge=0)]
Switch = Annotated[bool, StrictType()]
NgramLimits = tuple[tuple[Annotated[int, StrictType(), Field(ge=1)], Ratio], ...]


# ---------------------------------------------------------------- Gopher quality


class GopherQuality(Strict):
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

    min_words: Count = Field(default=50, description="fewest words [too_few_words]")
    max_words: Count = Field(default=100_000, description="most words [too_many_words]")
    min_mean_word_length: Length = Field(default=3.0, description="shortest mean word length, characters")
    max_mean_word_length: Length = Field(default=10.0, description="longest mean word length, characters")
    max_symbol_word_ratio: Ratio = Field(default=0.1, description="most `#` or ellipses per word")
    max_bullet_lines: Ratio = Field(default=0.9, description="largest fraction of lines starting with a bullet")
    max_ellipsis_lines: Ratio = Field(default=0.3, description="largest fraction of lines ending in an ellipsis")
    min_alpha_words: Ratio = Field(default=0.8, description="smallest fraction of words with a letter")
    min_stop_words: Count = Field(default=2, description="fewest English stop words (0: rule off)")

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
        if n and sum(k for w, k in counts.items()
                     if w.isalpha() or any(map(str.isalpha, w))) / n < self.min_alpha_words:
            out.append("alpha_words")
        if self.min_stop_words and sum(k for w, k in counts.items()
                                       if w.lower() in GOPHER_STOP_WORDS) < self.min_stop_words:
            out.append("stop_words")
        return out


# ---------------------------------------------------------------- Gopher repetition


class GopherRepetition(Strict):
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

    max_dup_line_fraction: Ratio = Field(default=0.30, description="largest fraction of duplicate lines")
    max_dup_paragraph_fraction: Ratio = Field(default=0.30, description="largest fraction of duplicate paragraphs")
    max_dup_line_chars: Ratio = Field(default=0.20, description="largest character fraction in duplicate lines")
    max_dup_paragraph_chars: Ratio = Field(
        default=0.20, description="largest character fraction in duplicate paragraphs")
    top_ngram_chars: NgramLimits = Field(
        default=((2, 0.20), (3, 0.18), (4, 0.16)),
        description="[[n, fraction], ...]: most characters the top n-gram may cover")
    dup_ngram_chars: NgramLimits = Field(
        default=((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)),
        description="[[n, fraction], ...]: most characters in duplicated n-grams")

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


class C4Lines(Strict):
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

    terminal_punct: Switch = Field(default=True, description="drop lines without terminal punctuation")
    min_words_per_line: Count = Field(default=3, description="drop lines with fewer words")
    max_word_length: Count = Field(default=1000, description="drop lines with a longer word (characters)")
    filter_javascript: Switch = Field(default=True, description="drop lines mentioning javascript")
    filter_policy: Switch = Field(default=True, description="drop lines with a cookie / terms policy phrase")
    filter_lorem_ipsum: Switch = Field(default=True, description="drop documents with lorem ipsum")
    filter_curly_bracket: Switch = Field(default=True, description="drop documents with a curly bracket")
    min_sentences: Count = Field(default=5, description="drop documents with fewer sentences left")

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


class QualityFilters(Strict):
    """The enabled quality filters of one source: the ``filters`` of the recipe's ``clean``
    section and of a source, and of the clean step config. A section that is ``None`` (or left
    out) is off; ``{}`` is on with the papers' defaults; keys override single thresholds.

    Applied in the order C4 lines (which edits the text), Gopher repetition, Gopher
    quality; every rule of every enabled filter is evaluated so each rule's hit rate is
    known, and the first hit in that order is the reason a document is filtered.

    Hashed form (:meth:`hashed`, which ``model_dump`` returns): each enabled section as the
    thresholds it sets, e.g. ``{"c4": {}, "gopher_repetition": {"max_dup_line_fraction": 0.5},
    "gopher_quality": None}``; the defaults are this module's.
    """

    c4: C4Lines | None = Field(default=None, description="C4 line rules (Raffel et al. 2020, 2.2)")
    gopher_repetition: GopherRepetition | None = Field(
        default=None, description="Gopher repetition rules (Rae et al. 2021, App. A, Table A1)")
    gopher_quality: GopherQuality | None = Field(
        default=None, description="Gopher quality rules (Rae et al. 2021, App. A.1.1)")

    @model_serializer
    def hashed(self) -> dict[str, dict[str, Any] | None]:
        """``{section: the thresholds it sets | None}`` for every section, in :data:`SECTIONS` order."""
        out: dict[str, dict[str, Any] | None] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = None if section is None else section.model_dump(mode="json", exclude_unset=True)
        return out

    def overridden_by(self, sections: QualityFilters | None) -> QualityFilters:
        """These filters with each section that ``sections`` sets (a source's own) in place of this one's."""
        if sections is None:
            return self
        return self.model_copy(update={name: getattr(sections, name) for name in sections.model_fields_set})

    def rule_names(self) -> list[str]:
        """Every ``section.rule`` name the enabled filters can report, in check order."""
        names = [f"c4.{r}" for r in C4_RULES] if self.c4 is not None else []
        if self.gopher_repetition is not None:
            names += [f"gopher_repetition.{r}" for r in self.gopher_repetition.rule_names()]
        if self.gopher_quality is not None:
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
