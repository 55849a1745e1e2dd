"""One raw record through the clean step's per-record rules: a pure function, no Beam, no I/O.

:func:`clean_record` decides, for one ``raw.parquet`` row, whether it is quarantined,
filtered (and by which rule) or survives as a document, in the order the clean step's
module docstring gives (:mod:`tidal.data.clean`), and adds every event it sees to a
:class:`collections.Counter` of outcome keys (``quarantined.<reason>``,
``filtered.<rule>``, ``hits.<rule>``, ``c4_lines.<reason>``, ``repaired.<reason>``,
``normalized.<step>``, ``special_tokens.<policy>``). The clean pipeline calls it on a batch
of rows at a time (:class:`tidal.data.clean.CleanBatchFn`) and turns the counter into Beam
counters and ``counts.json`` totals once per batch, not once per event.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, NamedTuple

from tidal.data.langid import identify
from tidal.data.normalize import (
    DEFAULT_SPECIAL_TOKENS,
    Quarantine,
    apply_special_token_policy,
    decode_with_policy,
    document_id,
    filter_reason,
    normalize_text_steps,
)

if TYPE_CHECKING:
    from tidal.data.clean.config import CleanConfig


class Document(NamedTuple):
    """A record that passed every per-record rule (not yet deduplicated).

    Attributes:
        id: sha256 hex of the normalized text (:func:`tidal.data.normalize.document_id`).
        ref: the record's ref (``ca01``, ``gcide.index:42``).
        text: the normalized, filtered text (C4 may have dropped lines).
        source: the source name.
        language: ISO 639-1 code from py3langid.
        fields: the record's own id and kept fields as JSON (``raw.parquet`` ``fields``), or ``None``.
    """

    id: str
    ref: str
    text: str
    source: str
    language: str
    fields: str | None = None


def quarantine_row(ref: str, raw: bytes, reason: str, detail: str, fields: str | None = None) -> dict[str, Any]:
    """A ``quarantine.parquet`` row: the record's original bytes with its reason and kept fields."""
    return {"ref": ref, "raw": raw, "reason": reason, "detail": detail, "fields": fields}


def removed_row(ref: str, outcome: str, reason: str, cluster: str | None = None,
                detail: str | None = None, fields: str | None = None) -> dict[str, Any]:
    """A ``removed.parquet`` row (``outcome`` is ``filtered`` or ``duplicate``) with the record's kept fields."""
    return {"ref": ref, "outcome": outcome, "reason": reason, "cluster": cluster, "detail": detail, "fields": fields}


def clean_record(row: dict[str, Any], cfg: CleanConfig, counts: Counter) -> tuple[str, Any]:
    """Apply the per-record rules to one ``raw.parquet`` row.

    Args:
        row: ``{"ref", "raw" (bytes), "source", "reason" (reader quarantine or None),
            "detail", "fields" (optional)}``.
        cfg: the step's :class:`tidal.data.clean.CleanConfig`.
        counts: outcome keys seen are added here (module docstring).

    Returns:
        ``("quarantine", quarantine row)``, ``("removed", removed row)`` for a filtered
        record, or ``("document", Document)``.
    """
    ref, raw, fields = row["ref"], row["raw"], row.get("fields")
    if row.get("reason"):
        return _quarantine(ref, raw, row["reason"], row.get("detail") or "", counts, fields)
    text, problem = decode_with_policy(raw, cfg.invalid_utf8)
    if isinstance(text, Quarantine):
        return _quarantine(ref, raw, text.reason, text.detail, counts, fields)
    if problem is not None:
        counts[f"repaired.{problem}"] += 1
    text, steps = normalize_text_steps(text, cfg.normalization)
    for step in steps:
        counts[f"normalized.{step}"] += 1
    text, found = apply_special_token_policy(text, cfg.special_tokens, DEFAULT_SPECIAL_TOKENS)
    if found:
        counts[f"special_tokens.{cfg.special_tokens}"] += 1
    if isinstance(text, Quarantine):
        return _quarantine(ref, raw, text.reason, text.detail, counts, fields)
    rule = filter_reason(text, cfg)
    if rule is not None:
        return _filtered(ref, rule, [rule], counts, fields=fields)
    line_drops: Counter = Counter()
    text, hits = cfg.filters.apply(text, line_drops)
    for reason, n in line_drops.items():
        counts[f"c4_lines.{reason}"] += n
    lang, confidence = identify(text) if text else ("und", 0.0)
    language_rule = cfg.language.check(lang, confidence)
    if language_rule is not None:
        hits.append(f"language.{language_rule}")
    if not text and not hits:  # C4 removed every line but C4's own rules were off
        hits.append("empty")
    if hits:
        return _filtered(ref, hits[0], hits, counts, f"language {lang} ({confidence})" if language_rule else None,
                         fields)
    return "document", Document(document_id(text), ref, text, row["source"], lang, fields)


def _quarantine(ref: str, raw: bytes, reason: str, detail: str, counts: Counter,
                fields: str | None) -> tuple[str, dict]:
    counts[f"quarantined.{reason}"] += 1
    return "quarantine", quarantine_row(ref, raw, reason, detail, fields)


def _filtered(ref: str, rule: str, hits: list[str], counts: Counter, detail: str | None = None,
              fields: str | None = None) -> tuple[str, dict]:
    counts[f"filtered.{rule}"] += 1
    for hit in hits:
        counts[f"hits.{hit}"] += 1
    return "removed", removed_row(ref, "filtered", rule, detail=detail, fields=fields)
