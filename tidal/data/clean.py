"""The ``clean`` step kind: a Beam pipeline from ``raw.parquet`` to sharded, deduplicated documents.

Per record (in Beam): decode strict UTF-8 and normalize (:mod:`tidal.data.normalize`);
records that cannot be decoded are quarantined verbatim with their reason; the rest pass
the quality filters (each failure counted under its rule); survivors are keyed by
``id = sha256(normalized text)`` and grouped, and of each group the record with the lowest
ref (:func:`tidal.data.sources.ref_sort_key`) is kept, the others counted as duplicates.

Outputs (in ``out_dir``):

* ``documents-SSSSS-of-NNNNN.parquet``: columns ``id`` (64 hex chars), ``text``, ``source``,
  ``ref`` (the kept record's ref, for lineage); document goes to shard ``int(id, 16) % N``;
  every shard file exists (possibly empty) and is sorted by ``id``.
* ``quarantine.parquet``: ``ref``, ``raw`` (the original bytes), ``reason``, ``detail``
  (e.g. the byte offset of invalid UTF-8), sorted by ref.
* ``counts.json``: ``{"in", "kept", "filtered": {rule: n}, "duplicates",
  "quarantined": {reason: n}}``; the step fails unless in = kept + filtered + duplicates
  + quarantined.

Each shard, the quarantine and the counts are written by a Beam ``DoFn`` after a
``CoGroupByKey`` on the shard number, i.e. one worker sorts and writes one whole shard in
memory. That is the walking-skeleton shape (fine for these corpora, tens of MB); at scale
a shard would be range-partitioned and written with ``WriteToParquet``. Workers write into
``out_dir`` directly, so ``out_dir`` must be reachable from workers (true for the
DirectRunner). Parquet writer options are fixed (:data:`tidal.data.fetch.PARQUET_OPTIONS`),
so reruns give byte-identical files.

Runner: :mod:`tidal.data.beam_options` (in-process FnApiRunner unless ``$TIDAL_BEAM_ARGS`` says otherwise);
runner options are not part of the step's config or hash. Beam metrics counters
(namespace ``tidal.clean``) count every outcome too and are logged after the run.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from tidal.context import StepContext
from tidal.data.beam_options import beam_args
from tidal.data.fetch import RAW_FILE, write_parquet
from tidal.data.normalize import (
    FILTER_RULES,
    QUARANTINE_REASONS,
    FilterThresholds,
    Quarantine,
    check_form,
    document_id,
    filter_reason,
    normalize_record,
)
from tidal.data.sources import ref_sort_key
from tidal.jobcli import main

STEP_VERSION = 1
COUNTS_FILE = "counts.json"
QUARANTINE_FILE = "quarantine.parquet"
METRICS_NAMESPACE = "tidal.clean"
CONFIG_KEYS = {"source", "input", "normalization", "min_chars", "max_chars", "min_letter_fraction", "shards"}
DOCUMENT_SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string()), ("ref", pa.string())])
QUARANTINE_SCHEMA = pa.schema([("ref", pa.string()), ("raw", pa.binary()), ("reason", pa.string()), ("detail", pa.string())])

_QUARANTINE_TAG = "quarantine"
_OUTCOME_TAG = "outcome"


@dataclass(frozen=True)
class CleanConfig:
    """A validated clean step config.

    Attributes:
        source: source name (``"brown"``).
        input: the fetch step whose ``raw.parquet`` to read (``"fetch-brown"``).
        normalization: ``"NFC"`` (default) or ``"NFKC"``.
        thresholds: filter thresholds (defaults and sources in :class:`FilterThresholds`).
        shards: number of document shard files, >= 1 (default 1).
    """

    source: str
    input: str
    normalization: str
    thresholds: FilterThresholds
    shards: int

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
        return cls(
            source=config["source"],
            input=config["input"],
            normalization=check_form(config.get("normalization", "NFC")),
            thresholds=FilterThresholds.from_config(config),
            shards=shards,
        )


def shard_name(shard: int, shards: int) -> str:
    """File name of document shard ``shard`` of ``shards``: ``documents-00000-of-00002.parquet``."""
    return f"documents-{shard:05d}-of-{shards:05d}.parquet"


def shard_of(doc_id: str, shards: int) -> int:
    """Shard number of a document: ``int(id, 16) % shards``."""
    return int(doc_id, 16) % shards


# ---------------------------------------------------------------- Beam transforms


class NormalizeFn(beam.DoFn):
    """raw.parquet row -> ``(id, (ref, text, source))`` for survivors; tagged outputs
    ``quarantine`` (row dicts) and ``outcome`` (``("filtered.<rule>", 1)``)."""

    def __init__(self, form: str, thresholds: FilterThresholds):
        self.form = form
        self.thresholds = thresholds

    def process(self, row: dict) -> Iterable:
        ref, raw = row["ref"], row["raw"]
        text = normalize_record(raw, self.form)
        if isinstance(text, Quarantine):
            Metrics.counter(METRICS_NAMESPACE, f"quarantined.{text.reason}").inc()
            yield beam.pvalue.TaggedOutput(
                _QUARANTINE_TAG, {"ref": ref, "raw": raw, "reason": text.reason, "detail": text.detail}
            )
            return
        rule = filter_reason(text, self.thresholds)
        if rule is not None:
            Metrics.counter(METRICS_NAMESPACE, f"filtered.{rule}").inc()
            yield beam.pvalue.TaggedOutput(_OUTCOME_TAG, (f"filtered.{rule}", 1))
            return
        yield document_id(text), (ref, text, row["source"])


class KeepLowestRefFn(beam.DoFn):
    """``(id, [(ref, text, source)...])`` -> the lowest-ref document ``(id, text, source, ref)``;
    tagged output ``outcome`` gets ``("duplicates", n - 1)`` for the others."""

    def process(self, element: tuple) -> Iterable:
        doc_id, group = element
        group = list(group)
        ref, text, source = min(group, key=lambda item: ref_sort_key(item[0]))
        Metrics.counter(METRICS_NAMESPACE, "kept").inc()
        yield (doc_id, text, source, ref)
        if len(group) > 1:
            Metrics.counter(METRICS_NAMESPACE, "duplicates").inc(len(group) - 1)
            yield beam.pvalue.TaggedOutput(_OUTCOME_TAG, ("duplicates", len(group) - 1))


class WriteShardFn(beam.DoFn):
    """``(shard, {"docs": [...], "shard": [...]})`` -> writes that shard's file, sorted by id."""

    def __init__(self, out_dir: str, shards: int):
        self.out_dir = out_dir
        self.shards = shards

    def process(self, element: tuple) -> Iterable:
        shard, grouped = element
        docs = sorted(grouped["docs"])
        table = pa.table(
            {"id": [d[0] for d in docs], "text": [d[1] for d in docs],
             "source": [d[2] for d in docs], "ref": [d[3] for d in docs]},
            schema=DOCUMENT_SCHEMA,
        )
        path = write_parquet(table, Path(self.out_dir) / shard_name(shard, self.shards))
        yield str(path)


class WriteQuarantineFn(beam.DoFn):
    """``(0, {"rows": [...], ...})`` -> writes ``quarantine.parquet`` sorted by ref."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def process(self, element: tuple) -> Iterable:
        rows = sorted(element[1]["rows"], key=lambda r: ref_sort_key(r["ref"]))
        table = pa.table({name: [r[name] for r in rows] for name in QUARANTINE_SCHEMA.names}, schema=QUARANTINE_SCHEMA)
        yield str(write_parquet(table, Path(self.out_dir) / QUARANTINE_FILE))


def counts_from_totals(totals: dict[str, int]) -> dict[str, Any]:
    """Outcome totals (``in``, ``kept``, ``duplicates``, ``filtered.<rule>``,
    ``quarantined.<reason>``) -> the ``counts.json`` structure, every known rule and reason
    present (zero if unseen)."""
    filtered = {rule: 0 for rule in FILTER_RULES}
    quarantined = {reason: 0 for reason in QUARANTINE_REASONS}
    for key, n in totals.items():
        group, _, name = key.partition(".")
        if group == "filtered":
            filtered[name] = filtered.get(name, 0) + n
        elif group == "quarantined":
            quarantined[name] = quarantined.get(name, 0) + n
    return {
        "in": totals.get("in", 0),
        "kept": totals.get("kept", 0),
        "filtered": filtered,
        "duplicates": totals.get("duplicates", 0),
        "quarantined": quarantined,
    }


class WriteCountsFn(beam.DoFn):
    """The list of ``(outcome, n)`` totals -> writes ``counts.json``."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def process(self, totals: list) -> Iterable:
        counts = counts_from_totals(dict(totals))
        path = Path(self.out_dir) / COUNTS_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
        yield str(path)


def build_pipeline(pipeline: beam.Pipeline, raw_path: str, out_dir: str, cfg: CleanConfig) -> None:
    """Add the clean transforms to ``pipeline``: read ``raw_path``, write into ``out_dir``."""
    rows = pipeline | "ReadRaw" >> beam.io.ReadFromParquet(raw_path)
    normalized = rows | "Normalize" >> beam.ParDo(NormalizeFn(cfg.normalization, cfg.thresholds)).with_outputs(
        _QUARANTINE_TAG, _OUTCOME_TAG, main="docs"
    )
    deduped = (
        normalized.docs
        | "GroupById" >> beam.GroupByKey()
        | "KeepLowestRef" >> beam.ParDo(KeepLowestRefFn()).with_outputs(_OUTCOME_TAG, main="kept")
    )
    # documents: one CoGroupByKey group per shard, including empty shards
    shard_keys = pipeline | "ShardKeys" >> beam.Create([(k, k) for k in range(cfg.shards)])
    keyed_docs = deduped.kept | "KeyByShard" >> beam.Map(lambda d, n=cfg.shards: (shard_of(d[0], n), d))
    (
        {"docs": keyed_docs, "shard": shard_keys}
        | "GroupShards" >> beam.CoGroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShardFn(out_dir, cfg.shards))
    )
    # quarantine: one group, written even when empty
    (
        {"rows": normalized[_QUARANTINE_TAG] | "KeyQuarantine" >> beam.Map(lambda r: (0, r)),
         "one": pipeline | "QuarantineKey" >> beam.Create([(0, 0)])}
        | "GroupQuarantine" >> beam.CoGroupByKey()
        | "WriteQuarantine" >> beam.ParDo(WriteQuarantineFn(out_dir))
    )
    # counts, from the data itself (metrics are reported too, but the check uses these)
    outcomes = (
        rows | "CountIn" >> beam.Map(lambda _: ("in", 1)),
        deduped.kept | "CountKept" >> beam.Map(lambda _: ("kept", 1)),
        deduped[_OUTCOME_TAG],
        normalized[_OUTCOME_TAG],
        normalized[_QUARANTINE_TAG] | "CountQuarantine" >> beam.Map(lambda r: (f"quarantined.{r['reason']}", 1)),
    )
    (
        outcomes
        | "FlattenOutcomes" >> beam.Flatten()
        | "SumOutcomes" >> beam.CombinePerKey(sum)
        | "AllTotals" >> beam.combiners.ToList()
        | "WriteCounts" >> beam.ParDo(WriteCountsFn(out_dir))
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


def clean(
    raw_path: str | Path,
    out_dir: str | Path,
    cfg: CleanConfig,
    args: list[str] | None = None,
    log: logging.Logger | None = None,
) -> dict[str, Any]:
    """Run the clean pipeline on ``raw_path`` into ``out_dir`` and check the counts.

    ``args`` are Beam pipeline options (default :func:`beam_args`); the Beam counters are
    logged on ``log``.

    Returns:
        The ``counts.json`` structure.

    Raises:
        FileNotFoundError: if ``raw_path`` does not exist.
        ValueError: if the counts do not reconcile (see :func:`check_counts`).
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
    for counter in result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]:
        log.info("beam counter %s.%s = %s", METRICS_NAMESPACE, counter.key.metric.name, counter.committed)
    counts = json.loads((out_dir / COUNTS_FILE).read_text())
    check_counts(counts)
    return counts


def run(ctx: StepContext) -> dict:
    """Clean the input fetch step's ``raw.parquet`` (see module docstring).

    Returns:
        Flat summary: ``in``, ``kept``, ``filtered``, ``duplicates``, ``quarantined``,
        ``filtered_<rule>``, ``quarantined_<reason>``, ``shards``.

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
    """The summary :func:`run` returns, from a finished job's ``counts.json`` (checked again).

    Also what commits a job that ran elsewhere (:mod:`tidal.launch.beam_job`).
    """
    cfg = CleanConfig.from_config(config)
    counts = json.loads((Path(out_dir) / COUNTS_FILE).read_text())
    check_counts(counts)
    summary = {
        "in": counts["in"],
        "kept": counts["kept"],
        "filtered": sum(counts["filtered"].values()),
        "duplicates": counts["duplicates"],
        "quarantined": sum(counts["quarantined"].values()),
        "shards": cfg.shards,
    }
    summary.update({f"filtered_{rule}": n for rule, n in sorted(counts["filtered"].items())})
    summary.update({f"quarantined_{reason}": n for reason, n in sorted(counts["quarantined"].items())})
    return summary


if __name__ == "__main__":
    main(sys.modules[__name__], "clean")
