"""Text normalization and quality filters for the clean step: pure functions, no I/O.

Pipeline for one record (:func:`normalize_record`), in this order:

1. decode UTF-8 strictly; a failure quarantines the record as ``invalid_utf8`` with the
   byte offset of the first bad byte (lone surrogates encoded as UTF-8 count as invalid);
2. strip one leading byte-order mark (U+FEFF);
3. strip ANSI / ECMA-48 escape sequences (CSI ``ESC [ ... final``, OSC ``ESC ] ... BEL``,
   two-byte ``ESC X`` and 8-bit CSI U+009B) *before* control characters, so no ``[31m``
   residue is left behind;
4. line breaks CRLF, CR, U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR -> ``\\n``;
5. Unicode normalization form NFC (default; W3C Character Model for the WWW:
   String Matching, "Charmod-Norm", recommends NFC) or NFKC (folds compatibility
   characters, e.g. full-width ``，`` -> ``,``, which changes CJK punctuation);
6. strip control characters (category Cc) except ``\\n`` and ``\\t``;
7. strip trailing whitespace on every line, then leading/trailing whitespace of the text.

Filters (:func:`filter_reason`) are named rules checked in this order, first match wins:
``empty``, ``too_short``, ``too_long``, ``low_letter_fraction``. Thresholds come from the
step config (:class:`FilterThresholds`, where the defaults are, with their sources).
"""

from __future__ import annotations

import hashlib
import operator
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from pydantic import Field, model_validator

from tidal.config import Fraction, PositiveInt, Strict

NORMALIZATION_FORMS = ("NFC", "NFKC")
FILTER_RULES = ("empty", "too_short", "too_long", "low_letter_fraction")
NORMALIZATION_STEPS = ("bom", "ansi", "newlines", "unicode_form", "controls")
QUARANTINE_REASONS = ("invalid_utf8", "lone_surrogate")
UTF8_POLICIES = ("quarantine", "repair")
SPECIAL_TOKEN_POLICIES = ("text", "strip", "quarantine")
DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>",)
# A UTF-8-encoded UTF-16 surrogate (U+D800-U+DFFF): ED A0..BF 80..BF (RFC 3629 §3 forbids it).
_ENCODED_SURROGATE_RE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]")

BOM = "\ufeff"
# ECMA-48 (5th ed., 1991) §5.4 control sequences, §8.3.89 OSC, and C1 two-byte escapes.
_ANSI_RE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: ESC [ parameters intermediates final
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC ... terminated by BEL or ST
    r"|\x1b[ -/]*[0-~]"  # two-byte escapes (ESC 7, ESC c, ESC ( B ...)
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
)
_NEWLINE_RE = re.compile("\r\n|\r|\u2028|\u2029")
_TRAILING_WS_RE = re.compile(r"[^\S\n]+$", re.MULTILINE)
# Category Cc is exactly U+0000-U+001F and U+007F-U+009F (Unicode 15, UnicodeData.txt).
_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Every character steps 3, 4 and 6 act on (ESC and U+009B start each ANSI sequence; CR, U+2028,
# U+2029 are the rewritten line breaks; the Cc class): text without one skips those passes.
_SPECIAL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_LAST_CHAR = operator.itemgetter(slice(-1, None))
_ASCII_SPACES = bytes(c for c in range(128) if chr(c).isspace())
_ASCII_LETTERS = bytes(c for c in range(128) if unicodedata.category(chr(c))[0] in "LM")


@dataclass(frozen=True)
class Quarantine:
    """Why a record could not be turned into text.

    Attributes:
        reason: the counted category, one of :data:`QUARANTINE_REASONS`.
        detail: a human-readable explanation, e.g. ``"byte 17: invalid start byte"``.
    """

    reason: str
    detail: str


class FilterThresholds(Strict):
    """Thresholds of the basic filters; all lengths are in Unicode code points (characters). The
    flat ``min_chars``, ``max_chars``, ``min_letter_fraction`` of the recipe's ``clean`` section
    and the clean step config (:class:`tidal.data.clean.config.CleanSettings` extends this).

    Defaults and their sources:
        min_chars = 20: a character-count stand-in for C4's "at least 5 words per line"
            (Raffel et al. 2020, §2.2) and Gopher's word-count floor (Rae et al. 2021,
            App. A.1.1: 50 words); counted in characters because CJK text has no spaces.
            20 characters is about 4 English words or two lines of a Song ci poem.
        max_chars = 200_000: below Gopher's ceiling of 100,000 words (about 600,000
            characters) so one document cannot dominate a small mixture.
        min_letter_fraction = 0.5: a per-character version of Gopher's rule that 80% of
            words must contain an alphabetic character (Rae et al. 2021, App. A.1.1).
            Letters are Unicode categories L* (CJK ideographs are Lo) plus combining
            marks M* (Devanagari vowel signs are Mc and belong to their letter); the
            fraction is over non-whitespace characters, so indentation or the lack of
            spaces in CJK text does not move it. English prose scores about 0.8.
    """

    min_chars: PositiveInt = Field(default=20, description="drop documents shorter than this")
    max_chars: PositiveInt = Field(default=200_000, description="drop documents longer than this")
    min_letter_fraction: Fraction = Field(
        default=0.5, description="drop documents whose fraction of letter characters is below"
    )

    @model_validator(mode="after")
    def _bounds(self) -> FilterThresholds:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) exceeds max_chars ({self.max_chars})")
        return self


def check_form(form: str) -> str:
    """Validate a normalization form name.

    Raises:
        ValueError: if ``form`` is not one of :data:`NORMALIZATION_FORMS`.
    """
    if form not in NORMALIZATION_FORMS:
        raise ValueError(f"normalization must be one of {NORMALIZATION_FORMS}, got {form!r}")
    return form


def decode_utf8(raw: bytes) -> str | Quarantine:
    """Decode ``raw`` as strict UTF-8.

    Returns:
        The text, or a :class:`Quarantine` with reason ``invalid_utf8`` whose detail names
        the byte offset (0-based) of the first undecodable byte and the decoder's reason.
    """
    try:
        return raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as err:
        bad = raw[err.start : min(err.end, err.start + 4)].hex()
        return Quarantine("invalid_utf8", f"byte {err.start}: {err.reason} (0x{bad})")


def utf8_error_reason(raw: bytes, start: int) -> str:
    """``lone_surrogate`` when the undecodable bytes at ``start`` are an encoded UTF-16
    surrogate (what ``json.loads('"\\ud800"')`` text becomes with ``surrogatepass``), else
    ``invalid_utf8``."""
    return "lone_surrogate" if _ENCODED_SURROGATE_RE.match(raw, start) else "invalid_utf8"


def decode_with_policy(raw: bytes, policy: str = "quarantine") -> tuple[str | Quarantine, str | None]:
    """Decode ``raw`` under the recipe's invalid-UTF-8 policy.

    Args:
        raw: the record's bytes.
        policy: ``"quarantine"`` (the record is quarantined, nothing guessed) or
            ``"repair"`` (every maximal invalid subsequence becomes U+FFFD, the Unicode
            Standard §3.9 "U+FFFD substitution of maximal subparts" that Python's
            ``errors="replace"`` implements; an encoded surrogate becomes U+FFFD too).

    Returns:
        ``(text or Quarantine, problem)``: ``problem`` is ``None`` for valid UTF-8, else the
        reason of the first bad byte (``invalid_utf8`` / ``lone_surrogate``), counted by the
        caller as quarantined or as repaired.

    Raises:
        ValueError: for an unknown policy.
    """
    if policy not in UTF8_POLICIES:
        raise ValueError(f"invalid_utf8 policy must be one of {UTF8_POLICIES}, got {policy!r}")
    try:
        return raw.decode("utf-8", errors="strict"), None
    except UnicodeDecodeError as err:
        reason = utf8_error_reason(raw, err.start)
        if policy == "repair":
            return raw.decode("utf-8", errors="replace"), reason
        bad = raw[err.start : min(err.end, err.start + 4)].hex()
        return Quarantine(reason, f"byte {err.start}: {err.reason} (0x{bad})"), reason


def apply_special_token_policy(text: str, policy: str, tokens: tuple[str, ...] = DEFAULT_SPECIAL_TOKENS):
    """Handle special-token strings (``<|endoftext|>``) that occur literally in a document.

    Policies:
        ``"text"`` (default): keep the text; the tokenize step encodes it as ordinary text
            (``encode_special_tokens=True``), so only the packer ever emits the end-of-text
            id and a document can never fake a boundary.
        ``"strip"``: remove every occurrence.
        ``"quarantine"``: quarantine the record (reason ``special_token``).

    Returns:
        ``(text or Quarantine, found)``: ``found`` tells whether any token occurred (the
        caller counts it under ``special_tokens.<policy>``).

    Raises:
        ValueError: for an unknown policy.
    """
    if policy not in SPECIAL_TOKEN_POLICIES:
        raise ValueError(f"special_tokens policy must be one of {SPECIAL_TOKEN_POLICIES}, got {policy!r}")
    found = [t for t in tokens if t in text]
    if not found:
        return text, False
    if policy == "quarantine":
        return Quarantine("special_token", f"contains {found[0]!r}"), True
    if policy == "strip":
        for token in found:
            text = text.replace(token, "")
        return text, True
    return text, True


def strip_ansi(text: str) -> str:
    """Remove ANSI / ECMA-48 escape sequences (colours, cursor moves, OSC titles)."""
    return _ANSI_RE.sub("", text)


def normalize_newlines(text: str) -> str:
    """Turn CRLF, CR, U+2028 and U+2029 into ``\\n``."""
    return _NEWLINE_RE.sub("\n", text)


def strip_controls(text: str) -> str:
    """Remove every character of category Cc except ``\\n`` and ``\\t``."""
    return _CONTROL_RE.sub("", text)


def normalize_text(text: str, form: str = "NFC") -> str:
    """Apply steps 2-7 of the module docstring to already-decoded text.

    Args:
        text: decoded text.
        form: ``"NFC"`` or ``"NFKC"``.

    Raises:
        ValueError: for an unknown normalization form.
    """
    return normalize_text_steps(text, form)[0]


def normalize_text_steps(text: str, form: str = "NFC") -> tuple[str, list[str]]:
    """:func:`normalize_text`, also naming the steps that changed the text.

    Returns:
        ``(normalized text, steps)``: ``steps`` lists, in the order of
        :data:`NORMALIZATION_STEPS`, each of ``bom`` (a leading U+FEFF removed), ``ansi``
        (escape sequences removed), ``newlines`` (CRLF / CR / U+2028 / U+2029 rewritten),
        ``unicode_form`` (NFC / NFKC changed a character, e.g. NFD input recomposed) and
        ``controls`` (control characters removed) that changed it; the clean step counts
        each under ``normalized.<step>`` (whitespace trimming is not counted).

    Raises:
        ValueError: for an unknown normalization form.
    """
    check_form(form)
    steps = []
    if text.startswith(BOM):
        text = text[1:]
        steps.append("bom")
    special = _SPECIAL_RE.search(text) is not None  # else the ansi, newline and control passes change nothing
    for name, step in (("ansi", strip_ansi), ("newlines", normalize_newlines),
                       ("unicode_form", lambda t: unicodedata.normalize(form, t)), ("controls", strip_controls)):
        if not special and name != "unicode_form":
            continue
        changed = step(text)
        if changed != text:
            steps.append(name)
            special = True  # once a pass changed the text (e.g. NFKC), the later passes run
        text = changed
    if any(map(str.isspace, map(_LAST_CHAR, text.split("\n")))):  # some line ends in whitespace
        text = _TRAILING_WS_RE.sub("", text)
    return text.strip(), steps


def normalize_record(raw: bytes, form: str = "NFC") -> str | Quarantine:
    """Decode and normalize one raw record.

    Returns:
        The normalized text, or a :class:`Quarantine` when the bytes are not UTF-8.

    Raises:
        ValueError: for an unknown normalization form.
    """
    text = decode_utf8(raw)
    if isinstance(text, Quarantine):
        return text
    return normalize_text(text, form)


def letter_fraction(text: str) -> float:
    """Fraction of non-whitespace characters that are letters (L*) or combining marks (M*).

    Returns 0.0 for text with no non-whitespace characters. ASCII text is counted with
    ``bytes.translate``; other text through a table of the Basic Multilingual Plane's
    characters (:func:`_bmp_classes`), characters beyond it one by one.
    """
    if text.isascii():
        raw = text.encode("ascii")
        total = len(raw.translate(None, _ASCII_SPACES))
        letters = len(raw) - len(raw.translate(None, _ASCII_LETTERS))
        return letters / total if total else 0.0
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    astral = points > 0xFFFF
    spaces, letters, _ = np.bincount(_bmp_classes()[points[~astral]], minlength=3).tolist()
    total = len(text) - spaces
    if astral.any():
        for ch, n in Counter(text[i] for i in np.flatnonzero(astral).tolist()).items():
            if ch.isspace():
                total -= n
            elif unicodedata.category(ch)[0] in "LM":
                letters += n
    return letters / total if total else 0.0


@lru_cache(maxsize=1)
def _bmp_classes() -> np.ndarray:
    """``uint8[65536]``: per BMP code point 0 whitespace (``str.isspace``), 1 letter or mark
    (Unicode category L* or M*), 2 anything else; built once per process (~20 ms)."""
    chars = map(chr, range(0x10000))
    return np.fromiter((0 if ch.isspace() else 1 if unicodedata.category(ch)[0] in "LM" else 2 for ch in chars),
                       dtype=np.uint8, count=0x10000)


def filter_reason(text: str, thresholds: FilterThresholds) -> str | None:
    """The first filter rule that ``text`` fails, or ``None`` if it passes all of them.

    Rules, in order: ``empty`` (no characters), ``too_short`` (fewer than ``min_chars``
    characters), ``too_long`` (more than ``max_chars``), ``low_letter_fraction``
    (:func:`letter_fraction` below ``min_letter_fraction``).
    """
    n = len(text)
    if n == 0:
        return "empty"
    if n < thresholds.min_chars:
        return "too_short"
    if n > thresholds.max_chars:
        return "too_long"
    if letter_fraction(text) < thresholds.min_letter_fraction:
        return "low_letter_fraction"
    return None


def document_id(text: str) -> str:
    """The document id: hex sha256 of the normalized text's UTF-8 bytes (64 characters)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
