"""The ``clean`` step kind: a Beam pipeline from ``raw.parquet`` to sharded, deduplicated documents.

Invariant: every input record ends in exactly one of four places, and the step fails if
they do not add up: *kept* (a document shard), *filtered* (the rule that removed it),
*duplicate* (the id of the cluster's survivor) or *quarantined* (a reason). Every byte of
every output is a pure function of the input rows and the config, whatever the runner,
worker count or running mode.

Per record (:class:`NormalizeFn`), in order:

1. a record the reader could not parse (``raw.parquet`` ``reason`` set, see
   :mod:`tidal.data.readers`) is quarantined under that reason;
2. decode UTF-8 under the ``invalid_utf8`` policy (``quarantine`` | ``repair``; reason
   ``invalid_utf8`` or ``lone_surrogate``, counted in ``quarantined`` or ``repaired``);
3. normalize (:mod:`tidal.data.normalize`: BOM, ANSI, newlines, NFC/NFKC, controls; each
   step that changes the text is counted under ``normalized.<step>``: the record is kept, the
   repair is not silent);
4. special-token strings under the ``special_tokens`` policy (``text`` | ``strip`` |
   ``quarantine``; :func:`tidal.data.normalize.apply_special_token_policy`);
5. basic filters ``empty``, ``too_short``, ``too_long``, ``low_letter_fraction``;
6. quality filters of the source (:mod:`tidal.data.filters`: ``c4.*`` which also drops
   lines, ``gopher_repetition.*``, ``gopher_quality.*``);
7. language (:mod:`tidal.data.langid`: ``language.not_allowed``, ``language.low_confidence``).

The first failing rule filters the record; every failing rule of steps 6-7 is also counted
in ``hits`` (so each rule's hit rate is known even behind an earlier rule).

Survivors are keyed by ``id = sha256(normalized text)``; of each id the record with the
lowest ref (:func:`tidal.data.sources.ref_sort_key`) is kept (exact dedup); then, if
``near_dedup.enabled``, :class:`tidal.data.neardup.NearDuplicates` removes verified
near-duplicates into the cluster of their survivor.

Outputs (in ``out_dir``):

* ``documents-SSSSS-of-NNNNN.parquet``: ``id`` (64 hex chars), ``text``, ``source``, ``ref``
  (the kept record's ref), ``language`` (ISO 639-1, ``und`` if none); document goes to shard
  ``int(id, 16) % N``; every shard file exists (possibly empty) and is sorted by ``id``.
* ``quarantine.parquet``: ``ref``, ``raw`` (the original bytes), ``reason``, ``detail``,
  sorted by ref.
* ``removed.parquet``: ``ref``, ``outcome`` (``filtered`` | ``duplicate``), ``reason`` (the
  rule, or ``exact`` / ``near``), ``cluster`` (the survivor's id for duplicates), ``detail``
  (Jaccard similarity of a near duplicate), sorted by ref.
* ``counts.json``: ``{"in", "kept", "filtered": {rule: n}, "duplicates", "duplicates_by_kind":
  {"exact", "near"}, "quarantined": {reason: n}, "hits": {rule: n}, "c4_lines_dropped":
  {reason: n}, "repaired": {reason: n}, "normalized": {step: records it changed} (``bom``,
  ``ansi``, ``newlines``, ``unicode_form``, ``controls``; a record can count under several,
  see :func:`tidal.data.normalize.normalize_text_steps`), "special_tokens": {policy: n}, "languages":
  {lang: kept documents}, "neardup": {"candidate_pairs", "verified_pairs"}}``; every rule of
  the enabled filters is present (0 if unseen).
  The step fails unless in = kept + filtered + duplicates + quarantined and the row counts
  of the files agree (:func:`check_outputs`).

Each shard, the quarantine, the removed list and the counts are written by a Beam ``DoFn``
after a ``CoGroupByKey`` on the shard number, i.e. one worker sorts and writes one whole
shard in memory (fine for these corpora, tens of MB; at scale a shard would be
range-partitioned and written with ``WriteToParquet``). Workers write into ``out_dir``
directly, so ``out_dir`` must be reachable from workers (a shared filesystem on a cluster).
Parquet writer options are fixed (:data:`tidal.data.fetch.PARQUET_OPTIONS`), so reruns
give byte-identical files.

Runner: :mod:`tidal.data.beam_options`; runner options are not part of the step's config
or hash. Beam metrics counters (namespace ``tidal.clean``) count the same events as
``counts.json``; after an in-process run they are checked against it and logged, and the
summary the step returns (logged to MLflow as the step's metrics) carries every count.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from tidal.context import StepContext
from tidal.data.beam_options import beam_args
from tidal.data.fetch import RAW_FILE, write_parquet
from tidal.data.filters import QualityFilters
from tidal.data.langid import LANGUAGE_RULES, LanguageFilter, identify
from tidal.data.neardup import NearDupConfig, NearDuplicates
from tidal.data.normalize import (
    DEFAULT_SPECIAL_TOKENS,
    FILTER_RULES,
    NORMALIZATION_STEPS,
    QUARANTINE_REASONS,
    SPECIAL_TOKEN_POLICIES,
    UTF8_POLICIES,
    FilterThresholds,
    Quarantine,
    apply_special_token_policy,
    check_form,
    decode_with_policy,
    document_id,
    filter_reason,
    normalize_text_steps,
)
from tidal.data.readers import READ_REASONS
from tidal.data.sources import ref_sort_key
from tidal.jobcli import main

STEP_VERSION = 2
COUNTS_FILE = "counts.json"
QUARANTINE_FILE = "quarantine.parquet"
REMOVED_FILE = "removed.parquet"
METRICS_NAMESPACE = "tidal.clean"
CONFIG_KEYS = {"source", "input", "normalization", "min_chars", "max_chars", "min_letter_fraction", "shards",
               "invalid_utf8", "special_tokens", "filters", "language", "near_dedup"}
DOCUMENT_SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string()),
                             ("ref", pa.string()), ("language", pa.string())])
QUARANTINE_SCHEMA = pa.schema([("ref", pa.string()), ("raw", pa.binary()), ("reason", pa.string()), ("detail", pa.string())])
REMOVED_SCHEMA = pa.schema([("ref", pa.string()), ("outcome", pa.string()), ("reason", pa.string()),
                            ("cluster", pa.string()), ("detail", pa.string())])
# Count groups of counts.json besides in/kept (outcome key prefix -> counts.json key).
_GROUPS = {"filtered": "filtered", "quarantined": "quarantined", "duplicates": "duplicates_by_kind",
           "hits": "hits", "c4_lines": "c4_lines_dropped", "repaired": "repaired",
           "special_tokens": "special_tokens", "languages": "languages", "neardup": "neardup",
           "normalized": "normalized"}

_QUARANTINE_TAG = "quarantine"
_OUTCOME_TAG = "outcome"
_REMOVED_TAG = "removed"


@dataclass(frozen=True)
class CleanConfig:
    """A validated clean step config.

    Attributes:
        source: source name (``"brown"``).
        input: the fetch step whose ``raw.parquet`` to read (``"fetch-brown"``).
        normalization: ``"NFC"`` (default) or ``"NFKC"``.
        thresholds: basic filter thresholds (defaults and sources in :class:`FilterThresholds`).
        shards: number of document shard files, >= 1 (default 1).
        invalid_utf8: ``"quarantine"`` (default) or ``"repair"``.
        special_tokens: ``"text"`` (default), ``"strip"`` or ``"quarantine"``.
        filters: the source's quality filters (:class:`tidal.data.filters.QualityFilters`).
        language: allowed languages and minimum confidence (:class:`LanguageFilter`).
        near_dedup: near-duplicate settings (:class:`tidal.data.neardup.NearDupConfig`).
    """

    source: str
    input: str
    normalization: str
    thresholds: FilterThresholds
    shards: int
    invalid_utf8: str = "quarantine"
    special_tokens: str = "text"
    filters: QualityFilters = field(default_factory=QualityFilters)
    language: LanguageFilter = field(default_factory=LanguageFilter)
    near_dedup: NearDupConfig = field(default_factory=NearDupConfig)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CleanConfig:
        """Validate a step config.

        Raises:
            ValueError: naming an unknown or missing key, or a bad value.
        """
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise ValueError(f"clean config has unknown key(s) {unknown}; known {sorted(CONFIG_KEYS)}")
        for key in ("source", "input"):
            if not isinstance(config.get(key), str) or not config[key]:
                raise ValueError(f"clean config {key!r} must be a non-empty string, got {config.get(key)!r}")
        shards = config.get("shards", 1)
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 99999:
            raise ValueError(f"clean config 'shards' must be an integer in [1, 99999], got {shards!r}")
        invalid_utf8 = config.get("invalid_utf8", "quarantine")
        if invalid_utf8 not in UTF8_POLICIES:
            raise ValueError(f"clean config 'invalid_utf8' must be one of {UTF8_POLICIES}, got {invalid_utf8!r}")
        special = config.get("special_tokens", "text")
        if special not in SPECIAL_TOKEN_POLICIES:
            raise ValueError(f"clean config 'special_tokens' must be one of {SPECIAL_TOKEN_POLICIES}, got {special!r}")
        return cls(
            source=config["source"],
            input=config["input"],
            normalization=check_form(config.get("normalization", "NFC")),
            thresholds=FilterThresholds.from_config(config),
            shards=shards,
            invalid_utf8=invalid_utf8,
            special_tokens=special,
            filters=QualityFilters.from_config(config.get("filters")),
            language=LanguageFilter.from_config(config.get("language")),
            near_dedup=NearDupConfig.from_config(config.get("near_dedup")),
        )

    def rule_names(self) -> list[str]:
        """Every filter rule this config can report, in check order."""
        return [*FILTER_RULES, *self.filters.rule_names(), *(f"language.{r}" for r in LANGUAGE_RULES)]


def shard_name(shard: int, shards: int) -> str:
    """File name of document shard ``shard`` of ``shards``: ``documents-00000-of-00002.parquet``."""
    return f"documents-{shard:05d}-of-{shards:05d}.parquet"


def shard_of(doc_id: str, shards: int) -> int:
    """Shard number of a document: ``int(id, 16) % shards``."""
    return int(doc_id, 16) % shards


# ---------------------------------------------------------------- per record


def _count(key: str, n: int = 1):
    Metrics.counter(METRICS_NAMESPACE, key).inc(n)
    return beam.pvalue.TaggedOutput(_OUTCOME_TAG, (key, n))


def _removed(ref: str, outcome: str, reason: str, cluster: str | None = None, detail: str | None = None):
    return beam.pvalue.TaggedOutput(_REMOVED_TAG, {"ref": ref, "outcome": outcome, "reason": reason,
                                                   "cluster": cluster, "detail": detail})


class NormalizeFn(beam.DoFn):
    """raw.parquet row -> ``(id, (ref, text, source, language))`` for survivors (module
    docstring, steps 1-7); tagged outputs ``quarantine`` (row dicts), ``removed`` (row
    dicts of filtered records) and ``outcome`` (``(count key, n)``)."""

    def __init__(self, cfg: CleanConfig):
        self.cfg = cfg

    def process(self, row: dict) -> Iterable:
        cfg = self.cfg
        ref, raw = row["ref"], row["raw"]
        if row.get("reason"):
            yield from self._quarantine(ref, raw, row["reason"], row.get("detail") or "")
            return
        text, problem = decode_with_policy(raw, cfg.invalid_utf8)
        if isinstance(text, Quarantine):
            yield from self._quarantine(ref, raw, text.reason, text.detail)
            return
        if problem is not None:
            yield _count(f"repaired.{problem}")
        text, steps = normalize_text_steps(text, cfg.normalization)
        for step in steps:
            yield _count(f"normalized.{step}")
        text, found = apply_special_token_policy(text, cfg.special_tokens, DEFAULT_SPECIAL_TOKENS)
        if found:
            yield _count(f"special_tokens.{cfg.special_tokens}")
        if isinstance(text, Quarantine):
            yield from self._quarantine(ref, raw, text.reason, text.detail)
            return
        rule = filter_reason(text, cfg.thresholds)
        if rule is not None:
            yield from self._filtered(ref, rule, [rule])
            return
        line_drops: Counter = Counter()
        text, hits = cfg.filters.apply(text, line_drops)
        for reason, n in sorted(line_drops.items()):
            yield _count(f"c4_lines.{reason}", n)
        lang, confidence = identify(text) if text else ("und", 0.0)
        language_rule = cfg.language.check(lang, confidence)
        if language_rule is not None:
            hits.append(f"language.{language_rule}")
        if not text and not hits:  # C4 removed every line but C4's own rules were off
            hits.append("empty")
        if hits:
            yield from self._filtered(ref, hits[0], hits, f"language {lang} ({confidence})" if language_rule else None)
            return
        yield document_id(text), (ref, text, row["source"], lang)

    def _quarantine(self, ref: str, raw: bytes, reason: str, detail: str) -> Iterable:
        yield _count(f"quarantined.{reason}")
        yield beam.pvalue.TaggedOutput(_QUARANTINE_TAG, {"ref": ref, "raw": raw, "reason": reason, "detail": detail})

    def _filtered(self, ref: str, rule: str, hits: list[str], detail: str | None = None) -> Iterable:
        yield _count(f"filtered.{rule}")
        for hit in hits:
            yield _count(f"hits.{hit}")
        yield _removed(ref, "filtered", rule, detail=detail)


class KeepLowestRefFn(beam.DoFn):
    """``(id, [(ref, text, source, language)...])`` -> the lowest-ref one as ``(id, (ref, text,
    source, language))``; the others go to ``removed`` as exact duplicates of cluster ``id``."""

    def process(self, element: tuple) -> Iterable:
        doc_id, group = element
        group = sorted(group, key=lambda item: (ref_sort_key(item[0]), item))
        yield doc_id, group[0]
        for ref, *_ in group[1:]:
            yield _count("duplicates.exact")
            yield _removed(ref, "duplicate", "exact", cluster=doc_id)


def _apply_near(element: tuple, removed: dict) -> Iterable:
    """``(id, (ref, text, source, language))`` -> the kept document, or a near-duplicate
    ``removed`` row when ``removed`` (``{id: (survivor id, jaccard)}``) names it."""
    doc_id, (ref, *_) = element
    if doc_id in removed:
        survivor, sim = removed[doc_id]
        yield _count("duplicates.near")
        yield _removed(ref, "duplicate", "near", cluster=survivor, detail=f"jaccard={sim:.6f}")
    else:
        yield element


# ---------------------------------------------------------------- writers


class WriteShardFn(beam.DoFn):
    """``(shard, {"docs": [...], "shard": [...]})`` -> writes that shard's file, sorted by id."""

    def __init__(self, out_dir: str, shards: int):
        self.out_dir = out_dir
        self.shards = shards

    def process(self, element: tuple) -> Iterable:
        shard, grouped = element
        docs = sorted((doc_id, *rest) for doc_id, rest in grouped["docs"])
        table = pa.table(
            {"id": [d[0] for d in docs], "text": [d[2] for d in docs], "source": [d[3] for d in docs],
             "ref": [d[1] for d in docs], "language": [d[4] for d in docs]},
            schema=DOCUMENT_SCHEMA,
        )
        path = write_parquet(table, Path(self.out_dir) / shard_name(shard, self.shards))
        yield str(path)


class WriteRowsFn(beam.DoFn):
    """``(0, {"rows": [...], ...})`` -> writes one Parquet file of row dicts, sorted by ref."""

    def __init__(self, out_dir: str, name: str, schema: pa.Schema):
        self.out_dir = out_dir
        self.name = name
        self.schema = schema

    def process(self, element: tuple) -> Iterable:
        rows = sorted(element[1]["rows"], key=lambda r: (ref_sort_key(r["ref"]), r["ref"]))
        table = pa.table({name: [r[name] for r in rows] for name in self.schema.names}, schema=self.schema)
        yield str(write_parquet(table, Path(self.out_dir) / self.name))


def WriteQuarantineFn(out_dir: str) -> WriteRowsFn:
    """The writer of ``quarantine.parquet``."""
    return WriteRowsFn(out_dir, QUARANTINE_FILE, QUARANTINE_SCHEMA)


def counts_from_totals(totals: dict[str, int], rules: Iterable[str] = FILTER_RULES) -> dict[str, Any]:
    """Outcome totals (``in``, ``kept``, ``<group>.<name>``) -> the ``counts.json`` structure;
    every rule in ``rules`` and every known quarantine reason is present (zero if unseen)."""
    rules = list(rules)
    out: dict[str, Any] = {
        "in": totals.get("in", 0),
        "kept": totals.get("kept", 0),
        "filtered": dict.fromkeys(rules, 0),
        "quarantined": dict.fromkeys((*QUARANTINE_REASONS, "special_token", *READ_REASONS), 0),
        "duplicates_by_kind": {"exact": 0, "near": 0},
        "hits": dict.fromkeys(rules, 0),
        "c4_lines_dropped": {},
        "repaired": dict.fromkeys(QUARANTINE_REASONS, 0),
        "normalized": dict.fromkeys(NORMALIZATION_STEPS, 0),
        "special_tokens": {},
        "languages": {},
        "neardup": {"candidate_pairs": 0, "verified_pairs": 0},
    }
    for key, n in sorted(totals.items()):
        group, _, name = key.partition(".")
        if group in _GROUPS:
            bucket = out[_GROUPS[group]]
            bucket[name] = bucket.get(name, 0) + n
    out["duplicates"] = sum(out["duplicates_by_kind"].values())
    return out


class WriteCountsFn(beam.DoFn):
    """The list of ``(outcome, n)`` totals -> writes ``counts.json``."""

    def __init__(self, out_dir: str, rules: list[str]):
        self.out_dir = out_dir
        self.rules = rules

    def process(self, totals: list) -> Iterable:
        counts = counts_from_totals(dict(totals), self.rules)
        path = Path(self.out_dir) / COUNTS_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
        yield str(path)


def _write_one(pipeline, label: str, rows, writer: beam.DoFn) -> None:
    """Group every row under key 0 (a group exists even with no row) and write it."""
    (
        {"rows": rows | f"Key{label}" >> beam.Map(lambda r: (0, r)),
         "one": pipeline | f"{label}Key" >> beam.Create([(0, 0)])}
        | f"Group{label}" >> beam.CoGroupByKey()
        | f"Write{label}" >> beam.ParDo(writer)
    )


def build_pipeline(pipeline: beam.Pipeline, raw_path: str, out_dir: str, cfg: CleanConfig) -> None:
    """Add the clean transforms to ``pipeline``: read ``raw_path``, write into ``out_dir``."""
    rows = pipeline | "ReadRaw" >> beam.io.ReadFromParquet(raw_path)
    normalized = rows | "Normalize" >> beam.ParDo(NormalizeFn(cfg)).with_outputs(
        _QUARANTINE_TAG, _OUTCOME_TAG, _REMOVED_TAG, main="docs"
    )
    exact = (
        normalized.docs
        | "GroupById" >> beam.GroupByKey()
        | "KeepLowestRef" >> beam.ParDo(KeepLowestRefFn()).with_outputs(_OUTCOME_TAG, _REMOVED_TAG, main="kept")
    )
    outcomes = [normalized[_OUTCOME_TAG], exact[_OUTCOME_TAG]]
    removed = [normalized[_REMOVED_TAG], exact[_REMOVED_TAG]]
    kept = exact.kept
    if cfg.near_dedup.enabled:
        near, pair_counts = (
            kept
            | "RefText" >> beam.Map(lambda d: (d[0], (d[1][0], d[1][1])))
            | "NearDuplicates" >> NearDuplicates(cfg.near_dedup)
        )
        outcomes.append(pair_counts)
        applied = kept | "ApplyNear" >> beam.FlatMap(_apply_near, removed=beam.pvalue.AsDict(near)).with_outputs(
            _OUTCOME_TAG, _REMOVED_TAG, main="kept"
        )
        kept = applied.kept
        outcomes.append(applied[_OUTCOME_TAG])
        removed.append(applied[_REMOVED_TAG])
    # documents: one CoGroupByKey group per shard, including empty shards
    shard_keys = pipeline | "ShardKeys" >> beam.Create([(k, k) for k in range(cfg.shards)])
    keyed_docs = kept | "KeyByShard" >> beam.Map(lambda d, n=cfg.shards: (shard_of(d[0], n), d))
    (
        {"docs": keyed_docs, "shard": shard_keys}
        | "GroupShards" >> beam.CoGroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShardFn(out_dir, cfg.shards))
    )
    _write_one(pipeline, "Quarantine", normalized[_QUARANTINE_TAG], WriteQuarantineFn(out_dir))
    _write_one(pipeline, "Removed", tuple(removed) | "FlattenRemoved" >> beam.Flatten(),
               WriteRowsFn(out_dir, REMOVED_FILE, REMOVED_SCHEMA))
    # counts, from the data itself (the Beam counters count the same events; run() compares)
    outcomes += [
        rows | "CountIn" >> beam.Map(lambda _: ("in", 1)),
        kept | "CountKept" >> beam.Map(lambda _: ("kept", 1)),
        kept | "CountLanguages" >> beam.Map(lambda d: (f"languages.{d[1][3]}", 1)),
    ]
    (
        tuple(outcomes)
        | "FlattenOutcomes" >> beam.Flatten()
        | "SumOutcomes" >> beam.CombinePerKey(sum)
        | "AllTotals" >> beam.combiners.ToList()
        | "WriteCounts" >> beam.ParDo(WriteCountsFn(out_dir, cfg.rule_names()))
    )


def check_counts(counts: dict[str, Any]) -> None:
    """Check ``in = kept + filtered + duplicates + quarantined``.

    Raises:
        ValueError: naming all five numbers when they do not add up.
    """
    filtered = sum(counts["filtered"].values())
    quarantined = sum(counts["quarantined"].values())
    total = counts["kept"] + filtered + counts["duplicates"] + quarantined
    if counts["in"] != total:
        raise ValueError(
            f"clean counts do not reconcile: in={counts['in']} but kept={counts['kept']} + "
            f"filtered={filtered} + duplicates={counts['duplicates']} + quarantined={quarantined} = {total}"
        )


def check_outputs(out_dir: str | Path, counts: dict[str, Any], shards: int) -> None:
    """Check that the files hold what ``counts.json`` says: documents rows = kept, removed rows
    = filtered + duplicates (by outcome), quarantine rows = quarantined.

    Raises:
        ValueError: naming the file and both numbers on a mismatch.
    """
    out_dir = Path(out_dir)
    kept = sum(pq.read_metadata(out_dir / shard_name(k, shards)).num_rows for k in range(shards))
    removed = pq.read_table(out_dir / REMOVED_FILE, columns=["outcome"]).column("outcome").to_pylist()
    quarantined = pq.read_metadata(out_dir / QUARANTINE_FILE).num_rows
    checks = [
        ("documents shards", kept, counts["kept"]),
        (f"{REMOVED_FILE} filtered rows", removed.count("filtered"), sum(counts["filtered"].values())),
        (f"{REMOVED_FILE} duplicate rows", removed.count("duplicate"), counts["duplicates"]),
        (QUARANTINE_FILE, quarantined, sum(counts["quarantined"].values())),
    ]
    for name, found, expected in checks:
        if found != expected:
            raise ValueError(f"{out_dir}: {name} hold {found} records but counts.json says {expected}")


def clean(
    raw_path: str | Path,
    out_dir: str | Path,
    cfg: CleanConfig,
    args: list[str] | None = None,
    log: logging.Logger | None = None,
) -> dict[str, Any]:
    """Run the clean pipeline on ``raw_path`` into ``out_dir`` and check the counts.

    ``args`` are Beam pipeline options (default :func:`beam_args`); the Beam counters are
    logged on ``log`` and, where the runner reports committed counters, compared with the
    data-derived counts.

    Returns:
        The ``counts.json`` structure.

    Raises:
        FileNotFoundError: if ``raw_path`` does not exist.
        ValueError: if the counts do not reconcile (:func:`check_counts`, :func:`check_outputs`)
            or a Beam counter disagrees with them.
    """
    raw_path, out_dir = Path(raw_path), Path(out_dir)
    if not raw_path.is_file():
        raise FileNotFoundError(f"clean: input {raw_path} does not exist")
    out_dir.mkdir(parents=True, exist_ok=True)
    pipeline = beam.Pipeline(options=PipelineOptions(args if args is not None else beam_args()))
    build_pipeline(pipeline, str(raw_path), str(out_dir), cfg)
    result = pipeline.run()
    result.wait_until_finish()
    log = log or logging.getLogger("tidal.step")
    counters = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]:
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + (counter.committed or 0)
    for name, value in sorted(counters.items()):
        log.info("beam counter %s.%s = %s", METRICS_NAMESPACE, name, value)
    counts = json.loads((out_dir / COUNTS_FILE).read_text())
    check_counts(counts)
    check_outputs(out_dir, counts, cfg.shards)
    flat = flat_counts(counts)
    wrong = {k: (v, flat.get(k.replace(".", "_", 1))) for k, v in counters.items()
             if "." in k and v and flat.get(k.replace(".", "_", 1)) != v}
    if wrong:
        raise ValueError(f"clean: Beam counters disagree with counts.json: {wrong}")
    return counts


def flat_counts(counts: dict[str, Any]) -> dict[str, int]:
    """``counts.json`` as flat ``group_name`` keys (``filtered_c4.lorem_ipsum``, ``languages_en`` ...)."""
    flat = {"in": counts["in"], "kept": counts["kept"], "duplicates": counts["duplicates"],
            "filtered": sum(counts["filtered"].values()), "quarantined": sum(counts["quarantined"].values())}
    for prefix, key in _GROUPS.items():
        for name, n in counts.get(key, {}).items():
            flat[f"{prefix}_{name}"] = n
    return flat


def run(ctx: StepContext) -> dict:
    """Clean the input fetch step's ``raw.parquet`` (see module docstring).

    Returns:
        :func:`summarize`'s flat summary (logged to MLflow as the step's metrics).

    Raises:
        ValueError: for a bad config or counts that do not reconcile.
        KeyError: if the config's ``input`` is not an input of this step.
    """
    cfg = CleanConfig.from_config(ctx.config)
    raw_path = ctx.input_dir(cfg.input) / RAW_FILE
    clean(raw_path, ctx.out_dir, cfg, log=ctx.log)
    summary = summarize(ctx.config, ctx.out_dir)
    ctx.log.info("clean %s: %s", cfg.source, summary)
    return summary


def summarize(config: dict[str, Any], out_dir: str | Path) -> dict:
    """The summary :func:`run` returns, from a finished job's ``counts.json`` (checked again):
    ``in``, ``kept``, ``filtered``, ``duplicates``, ``quarantined``, ``shards`` and every
    count of :func:`flat_counts` (``filtered_<rule>``, ``quarantined_<reason>``,
    ``hits_<rule>``, ``duplicates_exact`` ...).

    Also what commits a job that ran elsewhere (:mod:`tidal.launch.beam_job`).
    """
    cfg = CleanConfig.from_config(config)
    counts = json.loads((Path(out_dir) / COUNTS_FILE).read_text())
    check_counts(counts)
    return {**flat_counts(counts), "shards": cfg.shards}


if __name__ == "__main__":
    main(sys.modules[__name__], "clean")
