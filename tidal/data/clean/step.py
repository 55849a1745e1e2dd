"""The ``clean`` step kind: a Beam pipeline from ``raw.parquet`` to sharded, deduplicated documents.

Invariant: every input record ends in exactly one of four places, and the step fails if
they do not add up: *kept* (a document shard), *filtered* (the rule that removed it),
*duplicate* (the id of the cluster's survivor) or *quarantined* (a reason). Every byte of
every output is a pure function of the input rows and the config, whatever the runner,
worker count or running mode.

Per record (:func:`tidal.data.clean.record.clean_record`, called by
:class:`tidal.data.clean.fns.CleanBatchFn`), in order:

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
  (the kept record's ref), ``language`` (ISO 639-1, ``und`` if none), ``fields`` (the kept
  record's own id and ``keep_fields`` as a JSON object from ``raw.parquet``, null if none:
  :mod:`tidal.data.record_fields`; never part of the text or the id); document goes to shard
  ``int(id, 16) % N``; every shard file exists (possibly empty) and is sorted by ``id``.
* ``quarantine.parquet``: ``ref``, ``raw`` (the original bytes), ``reason``, ``detail``,
  ``fields`` (as above, where the reader could read them), sorted by ref.
* ``removed.parquet``: ``ref``, ``outcome`` (``filtered`` | ``duplicate``), ``reason`` (the
  rule, or ``exact`` / ``near``), ``cluster`` (the survivor's id for duplicates), ``detail``
  (Jaccard similarity of a near duplicate), ``fields`` (the removed record's own, as above),
  sorted by ref.
* ``counts.json``: ``{"in", "kept", "filtered": {rule: n}, "duplicates", "duplicates_by_kind":
  {"exact", "near"}, "quarantined": {reason: n}, "hits": {rule: n}, "c4_lines_dropped":
  {reason: n}, "repaired": {reason: n}, "normalized": {step: records it changed} (``bom``,
  ``ansi``, ``newlines``, ``unicode_form``, ``controls``; a record can count under several,
  see :func:`tidal.data.normalize.normalize_text_steps`), "special_tokens": {policy: n}, "languages":
  {lang: kept documents}, "neardup": {"candidate_pairs", "verified_pairs", "oversized_buckets",
  "pairs_not_proposed"}}``; every rule of
  the enabled filters is present (0 if unseen).
  The step fails unless in = kept + filtered + duplicates + quarantined and the row counts
  of the files agree (:func:`check_files`; before any commit, :func:`check_outputs`).

Records are cleaned in batches (at most :data:`tidal.data.clean.fns.BATCH_ROWS` records and
:data:`tidal.data.clean.fns.BATCH_BYTES` raw bytes, streamed from slices of ``raw.parquet``
row groups), so the runner's per-element cost and the counters are paid once per batch
(:mod:`tidal.data.clean.fns`). ``raw.parquet`` is read in place where the fetch step lives (a
local directory or ``s3://…/{step_id}/raw.parquet``, :func:`tidal.data.clean.fns.open_raw`):
the launcher reads its footer, each worker the row group and columns of its slice; nothing
is downloaded whole. A batch's survivors and LSH bucket entries go to spill files
(:mod:`tidal.data.spill`) and only the files' paths cross Beam's shuffles, so the in-process
runner, which holds every shuffled collection in memory, holds no element per kept
document. What still grows with the corpus: a removed row per filtered or duplicate record
and the raw bytes of each quarantined one travel to the final step (:class:`FinishFn`,
which holds them all: small fractions of a corpus), near-dedup candidates' texts travel to
their verification, and a shard writer holds its shard's stubs. Exact duplicates meet where
they are written: a document's shard is a function of its id, so after a ``GroupByKey`` on
the shard number one worker reads the shard's stubs (id, ref, language: about 360 bytes a
document, :func:`tidal.data.clean.fns.read_stubs`; a shard of 10 million documents would
need 3.6 GB: use more ``shards``), deduplicates, sorts and writes the shard one row group at
a time (:func:`tidal.data.clean.fns.write_shard`; at web scale a shard would be
range-partitioned and written with ``WriteToParquet``). Workers write into the step's output
location directly (:class:`tidal.files.output.OutputDir`): a local directory for the in-process
runner, the attempt's staging prefix in the bucket for a job on a cluster runner (Flink, Dataflow),
with the spill files under the attempt's own prefix beside it; nothing is handed over on a disk.
Parquet writer options are fixed (:data:`tidal.data.fetch.PARQUET_OPTIONS`), so reruns
give byte-identical files.

Runner: :mod:`tidal.data.beam_options`; runner options are not part of the step's config
or hash. Beam metrics counters (namespace ``tidal.clean``) count the same events as
``counts.json``; after an in-process run they are checked against it and logged, and the
summary the step returns (logged to MLflow as the step's metrics) carries every count.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from tidal.context import SPILL_DIR, StepContext
from tidal.data.beam_options import beam_args, create_spread
from tidal.data.clean.config import CleanConfig
from tidal.data.clean.fns import (
    BANDS_TAG,
    COUNTS_FILE,
    DOCUMENT_SCHEMA,
    FINISH_TAG,
    GROUPS,
    METRICS_NAMESPACE,
    QUARANTINE_FILE,
    REMOVED_FILE,
    CleanBatchFn,
    FinishFn,
    WriteShardFn,
    counts_from_totals,
    near_by_shard,
    raw_slices,
    shard_name,
    shard_of,
)
from tidal.data.fetch import RAW_FILE
from tidal.data.neardup import NearDuplicates
from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles

# 7: an oversized LSH bucket's star starts at its survivor; 6: the `fields` column (a record's own id and
# keep_fields); 5: near-dup shingles of folded text
STEP_VERSION = 7
__all__ = ["COUNTS_FILE", "DOCUMENT_SCHEMA", "QUARANTINE_FILE", "REMOVED_FILE", "CleanConfig", "build_pipeline",
           "check_counts", "check_files", "check_outputs", "clean", "counts_from_totals", "expected_outputs",
           "flat_counts", "run", "shard_name", "shard_of", "summarize"]


def build_pipeline(pipeline: beam.Pipeline, raw_location: str, out: OutputDir, cfg: CleanConfig,
                   spill: OutputDir | None = None) -> None:
    """Add the clean transforms to ``pipeline``: read ``raw.parquet`` in place at ``raw_location``
    (a local path or a bucket URI; workers open it there), write into ``out`` (a local directory or
    a staging prefix in the bucket: workers write there directly), spill files into ``spill``
    (default ``out/_spill``).

    Records are cleaned in batches (module docstring) and only the spill files' paths of a
    batch's documents and bucket entries cross the shuffles, so Beam's per-element cost and the
    per-event counters are paid once per batch. Documents meet their exact duplicates where they are
    written: a document's shard is a function of its id, so the shard writer keeps the lowest
    ref of each id (and drops the verified near duplicates of its shard, joined by shard). Quarantine rows,
    removed rows and outcome counts meet in one final step (:class:`FinishFn`: one element,
    everything else as side inputs) that writes the small files and removes the spill files.
    Every transform and every fused stage is a fixed cost of each run (construction,
    translation, one bundle per stage on the in-process runner), so the graph has few.
    """
    spill = spill or out.child(SPILL_DIR)
    slices = create_spread(pipeline, "RawSlices", [((g, first), n) for g, first, n in raw_slices(raw_location)])
    batches = slices | "CleanBatches" >> beam.ParDo(
        CleanBatchFn(raw_location, cfg, spill, cfg.shards)).with_outputs(FINISH_TAG, BANDS_TAG, main="docs")
    finish = [batches[FINISH_TAG]]
    by_shard = {"docs": batches.docs}
    if cfg.near_dedup.enabled:
        removed, pair_counts = batches[BANDS_TAG] | "NearDuplicates" >> NearDuplicates(cfg.near_dedup)
        by_shard["near"] = removed | "NearByShard" >> beam.Map(near_by_shard, cfg.shards)
        finish.append(pair_counts)
    # one group per shard that holds documents (FinishFn writes the empty ones), with its near duplicates
    finish.append(
        by_shard
        | "GroupShards" >> beam.CoGroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShardFn(out, cfg.shards))
    )
    # quarantine, removed, counts (from the data itself; the Beam counters count the same
    # events, clean() compares), spill removal: once, after every shard is written
    _ = (
        pipeline
        | "Once" >> beam.Impulse()
        | "Finish" >> beam.ParDo(FinishFn(out, cfg.shards, cfg.rule_names(), spill),
                                 *(beam.pvalue.AsIter(items) for items in finish))
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


def check_files(out_dir: str | Path, counts: dict[str, Any], shards: int) -> None:
    """Check that the files hold what ``counts.json`` says: documents rows = kept, removed rows
    = filtered + duplicates (by outcome), quarantine rows = quarantined.

    Raises:
        ValueError: naming the file and both numbers on a mismatch.
    """
    files = StepFiles.open(out_dir)

    def metadata(name: str) -> pq.FileMetaData:
        with files.open_input(name) as source:
            return pq.read_metadata(source)

    kept = sum(metadata(shard_name(k, shards)).num_rows for k in range(shards))
    with files.open_input(REMOVED_FILE) as source:
        removed = pq.read_table(source, columns=["outcome"]).column("outcome").to_pylist()
    quarantined = metadata(QUARANTINE_FILE).num_rows
    checks = [
        ("documents shards", kept, counts["kept"]),
        (f"{REMOVED_FILE} filtered rows", removed.count("filtered"), sum(counts["filtered"].values())),
        (f"{REMOVED_FILE} duplicate rows", removed.count("duplicate"), counts["duplicates"]),
        (QUARANTINE_FILE, quarantined, sum(counts["quarantined"].values())),
    ]
    for name, found, expected in checks:
        if found != expected:
            raise ValueError(f"{files.uri}: {name} hold {found} records but counts.json says {expected}")


def clean(
    raw_location: str | Path,
    out_dir: str | Path | OutputDir,
    cfg: CleanConfig,
    args: list[str] | None = None,
    log: logging.Logger | None = None,
    spill: OutputDir | None = None,
) -> dict[str, Any]:
    """Run the clean pipeline on ``raw.parquet`` at ``raw_location`` (a local path, or a bucket URI
    such as ``s3://bucket/root/{step_id}/raw.parquet``, read in place) into ``out_dir`` (a directory,
    or an :class:`~tidal.files.output.OutputDir` such as a staging prefix in the bucket, which
    the workers write to directly; spill files in ``spill``, default ``out_dir/_spill``) and
    check the counts.

    ``args`` are Beam pipeline options (default :func:`beam_args`); the Beam counters are
    logged on ``log`` and, where the runner reports committed counters, compared with the
    data-derived counts.

    Returns:
        The ``counts.json`` structure.

    Raises:
        FileNotFoundError: if ``raw_location`` does not exist.
        ValueError: if the counts do not reconcile (:func:`check_counts`, :func:`check_files`)
            or a Beam counter disagrees with them.
    """
    out = out_dir if isinstance(out_dir, OutputDir) else OutputDir(out_dir)
    spill = spill or out.child(SPILL_DIR)
    files, name = StepFiles.of_file(raw_location)
    if not files.exists(name):
        raise FileNotFoundError(f"clean: input {files.uri_of(name)} does not exist")
    if not out.remote:
        Path(out.location).mkdir(parents=True, exist_ok=True)
    pipeline = beam.Pipeline(options=PipelineOptions(args if args is not None else beam_args()))
    build_pipeline(pipeline, files.uri_of(name), out, cfg, spill)
    try:
        result = pipeline.run()
        result.wait_until_finish()
    finally:  # the pipeline removes its spill files; this also covers a failed run
        spill.remove()
    log = log or logging.getLogger("tidal.step")
    counters = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]:
        counters[counter.key.metric.name] = counters.get(counter.key.metric.name, 0) + (counter.committed or 0)
    for name, value in sorted(counters.items()):
        log.info("beam counter %s.%s = %s", METRICS_NAMESPACE, name, value)
    counts = StepFiles.open(out.location).read_json(COUNTS_FILE)
    check_counts(counts)
    check_files(out.location, counts, cfg.shards)
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
    for prefix, key in GROUPS.items():
        for name, n in counts.get(key, {}).items():
            flat[f"{prefix}_{name}"] = n
    return flat


def run(ctx: StepContext) -> dict:
    """Clean the input fetch step's ``raw.parquet``, read in place where that step lives (a local
    directory or its prefix in the bucket; no local copy, see module docstring).

    Returns:
        :func:`summarize`'s flat summary (logged to MLflow as the step's metrics).

    ``ctx.config`` is the step's :class:`CleanConfig`, parsed once (at plan time, or by the job
    command from its JSON) and handed over unchanged.

    Raises:
        ValueError: for counts that do not reconcile.
        KeyError: if the config's ``input`` is not an input of this step.
    """
    cfg: CleanConfig = ctx.config
    out = ctx.output()
    clean(ctx.input_files(cfg.input).uri_of(RAW_FILE), out, cfg, log=ctx.log, spill=ctx.spill())
    summary = summarize(cfg, out.location)
    ctx.log.info("clean %s: %s", cfg.source, summary)
    return summary


def summarize(cfg: CleanConfig, out_dir: str | Path) -> dict:
    """The summary :func:`run` returns, from a finished job's ``counts.json`` (checked again):
    ``in``, ``kept``, ``filtered``, ``duplicates``, ``quarantined``, ``shards`` and every
    count of :func:`flat_counts` (``filtered_<rule>``, ``quarantined_<reason>``,
    ``hits_<rule>``, ``duplicates_exact`` ...).

    Also what commits a job that ran elsewhere (:mod:`tidal.core.beam_job`).
    """
    counts = StepFiles.open(out_dir).read_json(COUNTS_FILE)
    check_counts(counts)
    return {**flat_counts(counts), "shards": cfg.shards}


def expected_outputs(cfg: CleanConfig) -> list[str]:
    """The files a finished clean run writes (docs/contracts.md): ``counts.json``,
    ``quarantine.parquet``, ``removed.parquet`` and ``shards`` document shards.

    Part of the kind's commit contract (:func:`tidal.core.commit.check_outputs`), checked on
    every path that commits a clean step (in-process, Beam-provider job).
    """
    return [COUNTS_FILE, QUARANTINE_FILE, REMOVED_FILE, *(shard_name(k, cfg.shards) for k in range(cfg.shards))]


def check_outputs(cfg: CleanConfig, out_dir: str | Path) -> None:
    """Before a commit: ``counts.json`` reconciles (``in = kept + filtered + duplicates +
    quarantined``) and the files hold the rows it counts (:func:`check_files`).

    Raises:
        ValueError: naming the file and both numbers on a mismatch.
    """
    counts = StepFiles.open(out_dir).read_json(COUNTS_FILE)
    check_counts(counts)
    check_files(out_dir, counts, cfg.shards)
