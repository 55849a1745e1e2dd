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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# langid reads at most this many characters: the posterior of a naive-Bayes byte n-gram
# model saturates within a few hundred characters (Brown: 1.0 either way), and langid costs
# about 5 us per character, so a 50 MB one-line document must not be read whole.
MAX_CHARS = 2_000
LANGUAGE_RULES = ("not_allowed", "low_confidence")


@lru_cache(maxsize=1)
def _identifier():
    """The py3langid identifier with normalized probabilities (loaded once per process, ~0.6 s)."""
    from py3langid import langid
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_modelpath(langid.MODEL_DIR / MODEL_FILE, norm_probs=True)


def identify(text: str) -> tuple[str, float]:
    """``(language code, confidence in [0, 1])`` of ``text`` (first :data:`MAX_CHARS` characters).

    Text without any letter gets ``("und", 0.0)`` (undetermined, ISO 639-2).
    """
    sample = text[:MAX_CHARS]
    if not any(ch.isalpha() for ch in sample):
        return "und", 0.0
    lang, prob = _identifier().classify(sample)
    return str(lang), round(float(prob), 4)


@dataclass(frozen=True)
class LanguageFilter:
    """Allowed languages of one source and the minimum confidence.

    Attributes:
        allowed: ISO 639-1 codes to keep; empty tuple = keep every language (identify only).
        min_confidence: drop documents whose confidence is below this (default 0.0: none);
            py3langid gives short classical Chinese poems about 0.5, English prose 0.98+.
    """

    allowed: tuple[str, ...] = ()
    min_confidence: float = 0.0

    @classmethod
    def from_config(cls, values: dict[str, Any] | None) -> LanguageFilter:
        """From ``{"allowed": [codes] | None, "min_confidence": float}`` (None: no filter).

        Raises:
            ValueError: for unknown keys, codes that are not strings, or a confidence
                outside [0, 1].
        """
        values = values or {}
        unknown = sorted(set(values) - {"allowed", "min_confidence"})
        if unknown:
            raise ValueError(f"language filter: unknown key(s) {unknown}; known ['allowed', 'min_confidence']")
        allowed = values.get("allowed") or ()
        if not all(isinstance(code, str) and code for code in allowed):
            raise ValueError(f"language filter 'allowed' must be a list of language codes, got {allowed!r}")
        conf = values.get("min_confidence", 0.0)
        if isinstance(conf, bool) or not isinstance(conf, (int, float)) or not 0 <= conf <= 1:
            raise ValueError(f"language filter 'min_confidence' must be in [0, 1], got {conf!r}")
        return cls(tuple(sorted(allowed)), float(conf))

    def check(self, lang: str, confidence: float) -> str | None:
        """The failed rule (``not_allowed`` / ``low_confidence``) or ``None``."""
        if self.allowed and lang not in self.allowed:
            return "not_allowed"
        if confidence < self.min_confidence:
            return "low_confidence"
        return None
