"""The clean step's Beam functions: batch reader and cleaner, shard writer, final writer.

File layout and the accounting rules are in :mod:`tidal.data.clean`'s module docstring;
the per-record rules in :mod:`tidal.data.clean.record`. Every element that crosses a Beam
stage here stands for a batch (a spill file's path, a list of rows, a dict of counts), so
the runner's per-element cost is paid once per batch, not per record.

*Finish items* are what the single final stage (:class:`FinishFn`) gathers: a dict of outcome
counts, ``(QUARANTINE_TAG | REMOVED_TAG, [row...])`` or ``(SHARD_TAG, shard number written)``;
the batch cleaner, the shard writer and the near-duplicate verifier emit them.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import count, groupby, repeat
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics

from tidal.data.clean.record import Document, clean_record, removed_row
from tidal.data.fetch import FETCH_SCHEMA, write_parquet, write_parquet_chunks
from tidal.data.neardup import band_entries
from tidal.data.normalize import FILTER_RULES, NORMALIZATION_STEPS, QUARANTINE_REASONS
from tidal.data.readers import READ_REASONS
from tidal.data.shards import DOCUMENT_SCHEMA
from tidal.data.sources import ref_sort_key
from tidal.data.spill import (
    SPILL_SCHEMA,
    STUB_COLUMNS,
    TEXT_BYTES,
    read_spill,
    read_texts,
    write_bands,
    write_spill,
)
from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles

if TYPE_CHECKING:
    from tidal.data.clean.config import CleanConfig

BATCH_ROWS = 1000  # records per batch
# and at most this many raw bytes: per-batch memory is a few times this (MinHash's per-word
# arrays, the decoded text), so it caps the step's peak memory; 1 MB batches already hold
# 1,000 records of typical web text (about 1 KB each): 4 MB ones raised the peak by tens of MB
# on sources of long documents (udhr at 16x in bench/data_pipeline.py: 455 -> 420 MB)
BATCH_BYTES = 1 << 20
# Row groups of a document shard: at most this many documents and bytes of text, so the shard
# writer holds one row group's texts (a few times WRITE_BYTES), not the whole shard's
WRITE_ROWS = 8192
WRITE_BYTES = 8 << 20
READ_ROWS = 128  # rows per Arrow record batch read from raw.parquet (decoded at most this many ahead)
# raw.parquet's column chunks are streamed through a buffer of this size per column, on demand
# (no pre-buffering of the whole row group): a slice stops reading at its last row, so from a
# bucket it fetches its row group's chunks up to that row (plus one buffer), not the whole group,
# and memory holds a buffer (or one larger page) per column, not the row group's compressed chunks
READ_BUFFER_BYTES = 4 << 20
# Rows of one clean input element (a slice of a raw.parquet row group). Fetch writes row groups
# of 64k rows, so without slicing a source under 64k records would be one element, cleaned by
# one worker on a multi-worker runner. A slice is read by streaming its row group from the
# start and skipping the rows before it (Parquet has no row offset to seek to): at most
# 64k / 8k = 8 slices re-decode on average half a group, a few % of cleaning it (read from a
# bucket, the skipped rows' bytes are fetched again too: about (slices + 1) / 2 times the group).
SLICE_ROWS = 8 * BATCH_ROWS
COUNTS_FILE = "counts.json"
QUARANTINE_FILE = "quarantine.parquet"
REMOVED_FILE = "removed.parquet"
METRICS_NAMESPACE = "tidal.clean"
QUARANTINE_SCHEMA = pa.schema([("ref", pa.string()), ("raw", pa.binary()), ("reason", pa.string()),
                               ("detail", pa.string()), ("fields", pa.string())])
REMOVED_SCHEMA = pa.schema([("ref", pa.string()), ("outcome", pa.string()), ("reason", pa.string()),
                            ("cluster", pa.string()), ("detail", pa.string()), ("fields", pa.string())])
# Count groups of counts.json besides in/kept (outcome key prefix -> counts.json key).
GROUPS = {"filtered": "filtered", "quarantined": "quarantined", "duplicates": "duplicates_by_kind",
          "hits": "hits", "c4_lines": "c4_lines_dropped", "repaired": "repaired",
          "special_tokens": "special_tokens", "languages": "languages", "neardup": "neardup",
          "normalized": "normalized"}
QUARANTINE_TAG = "quarantine"  # kinds of finish items (module docstring)
REMOVED_TAG = "removed"
SHARD_TAG = "shard"
FINISH_TAG = "finish"  # tagged outputs
BANDS_TAG = "bands"


def shard_name(shard: int, shards: int) -> str:
    """File name of document shard ``shard`` of ``shards``: ``documents-00000-of-00002.parquet``."""
    return f"documents-{shard:05d}-of-{shards:05d}.parquet"


def shard_of(doc_id: str, shards: int) -> int:
    """Shard number of a document: ``int(id, 16) % shards``."""
    return int(doc_id, 16) % shards


@contextmanager
def open_raw(raw_location: str | Path) -> Iterator[pq.ParquetFile]:
    """``raw.parquet`` at ``raw_location`` read in place: a local path, or its URI in the bucket
    (``s3://bucket/root/{step_id}/raw.parquet``), opened with :meth:`tidal.files.step_files.StepFiles.open_input`
    (a plain local file on a local root; from a bucket the footer, then only the byte ranges
    decoded, streamed through :data:`READ_BUFFER_BYTES` buffers). Nothing is downloaded whole.

    Raises:
        FileNotFoundError: naming the file.
    """
    files, name = StepFiles.of_file(raw_location)
    with files.open_input(name) as source:
        yield pq.ParquetFile(source, pre_buffer=False, buffer_size=READ_BUFFER_BYTES)


def raw_slices(raw_location: str | Path, slice_rows: int | None = None) -> list[tuple[int, int, int]]:
    """``(row group, first row in it, rows)`` of ``raw.parquet`` at ``raw_location`` (a path or a
    bucket URI, :func:`open_raw`: only the footer is read): the elements the clean step's first
    stage reads, at most ``slice_rows`` rows each (:data:`SLICE_ROWS`), every row of every row
    group in exactly one; each is streamed in batches (:class:`CleanBatchFn`)."""
    slice_rows = slice_rows or SLICE_ROWS
    with open_raw(raw_location) as parquet:
        meta = parquet.metadata
    return [(g, start, min(slice_rows, meta.row_group(g).num_rows - start))
            for g in range(meta.num_row_groups) for start in range(0, meta.row_group(g).num_rows, slice_rows)]


def _emit_counts(counts: Counter) -> dict[str, int]:
    """Beam counters of a batch's events (keys with a group prefix), once per key."""
    for key, n in counts.items():
        if "." in key and n:
            Metrics.counter(METRICS_NAMESPACE, key).inc(n)
    return dict(counts)


class DocStub(NamedTuple):
    """A surviving document without its text, which waits in a spill file (:mod:`tidal.data.spill`).

    Attributes:
        id, ref, source, language, fields: as :class:`tidal.data.clean.record.Document`.
        spill: the spill file holding the text.
        row: the text's row in it.
        nbytes: the text's UTF-8 bytes.
    """

    id: str
    ref: str
    source: str
    language: str
    fields: str | None
    spill: str
    row: int
    nbytes: int


class CleanBatchFn(beam.DoFn):
    """``((row group, first row), [rows])`` of ``raw.parquet`` (:func:`raw_slices`), read in place
    from ``raw_location`` (a local path or a bucket URI, :func:`open_raw`: of the file only the
    footer and that row group's chunks of the columns :func:`tidal.data.clean.record.clean_record`
    reads, up to the slice's last row) in batches of at most :data:`BATCH_ROWS` records and
    :data:`BATCH_BYTES` raw bytes (streamed: memory holds a batch, not the row group) -> per
    batch and shard it touches, ``(shard, spill file)`` (main output): the batch's survivors of that
    shard written to one spill file under ``spill_dir`` (:func:`tidal.data.spill.write_spill`);
    on the ``finish`` output (module docstring) the quarantine rows, the removed (filtered)
    rows and one dict of outcome counts (``in`` included) and, with near-dedup on, on the
    ``bands`` output ``(partition, bands file)`` for each partition of the batch's LSH bucket
    entries (:func:`tidal.data.neardup.band_entries`, written by
    :func:`tidal.data.spill.write_bands`). Only paths cross the shuffles (:mod:`tidal.data.spill`).

    Raises:
        ValueError: for a record whose ``raw`` is null, naming the file, row group and ref.
    """

    def __init__(self, raw_location: str, cfg: CleanConfig, spill: OutputDir, shards: int):
        self.raw_location = raw_location
        self.cfg = cfg
        self.spill = spill
        self.shards = shards

    def process(self, element: tuple[tuple[int, int], Iterable[int]]) -> Iterable:
        (group, first), counts = element  # as create_spread gives it: ((group, first row), [rows])
        count = next(iter(counts))
        start, end = first, first + count
        seen = 0  # rows of the row group streamed past so far
        pending: list[dict[str, Any]] = []  # the batch being filled
        size = 0  # its raw bytes
        with open_raw(self.raw_location) as parquet:
            columns = [name for name in FETCH_SCHEMA.names if name in parquet.schema_arrow.names]
            for record_batch in parquet.iter_batches(batch_size=READ_ROWS, row_groups=[group], columns=columns):
                seen, before = seen + record_batch.num_rows, seen
                if seen <= first:
                    continue
                for row in record_batch.slice(max(0, first - before), min(end, seen) - max(first, before)).to_pylist():
                    if not isinstance(row["raw"], bytes):  # bad data in a file: ValueError, as elsewhere
                        raise ValueError(  # noqa: TRY004
                            f"{self.raw_location}: row group {group}, record {row['ref']!r}: 'raw' is "
                            f"{type(row['raw']).__name__}, not bytes (fetch writes every record's bytes)")
                    # at most BATCH_ROWS records and BATCH_BYTES raw bytes, unless one record alone is larger
                    if pending and (len(pending) >= BATCH_ROWS or size + len(row["raw"]) > BATCH_BYTES):
                        yield from self._batch(group, start, pending)
                        start, pending, size = start + len(pending), [], 0
                    pending.append(row)
                    size += len(row["raw"])
                if seen >= end:  # the slice's last row: read no further batch
                    break
        if pending:
            yield from self._batch(group, start, pending)

    def _batch(self, group: int, start: int, rows: list[dict[str, Any]]) -> Iterable:
        counts: Counter = Counter(**{"in": len(rows)})
        docs: list[Document] = []
        out: dict[str, list] = {QUARANTINE_TAG: [], REMOVED_TAG: []}
        for row in rows:
            kind, value = clean_record(row, self.cfg, counts)
            if kind == "document":
                docs.append(value)
            else:
                out[QUARANTINE_TAG if kind == "quarantine" else REMOVED_TAG].append(value)
        by_shard: dict[int, list[Document]] = defaultdict(list)
        for doc in docs:
            by_shard[shard_of(doc.id, self.shards)].append(doc)
        name = f"g{group:05d}-r{start:09d}"
        for shard, mine in sorted(by_shard.items()):
            yield shard, write_spill(self.spill, f"s{shard:05d}-{name}.arrow",
                                     {column: [getattr(d, column) for d in mine] for column in SPILL_SCHEMA.names})
        if self.cfg.near_dedup.enabled and docs:
            rows: Counter = Counter()  # a document's row in its shard's spill file of this batch
            places = []
            for d in docs:
                shard = shard_of(d.id, self.shards)
                places.append((shard, rows[shard]))
                rows[shard] += 1
            entries = band_entries(((d.id, d.ref, d.text, *place) for d, place in zip(docs, places, strict=True)),
                                   self.cfg.near_dedup)
            if entries:
                path = write_bands(self.spill, f"bands-{name}.npz", entries)
                for partition in sorted(entries):
                    yield beam.pvalue.TaggedOutput(BANDS_TAG, (partition, path))
        for kind, values in out.items():
            if values:
                yield beam.pvalue.TaggedOutput(FINISH_TAG, (kind, values))
        yield beam.pvalue.TaggedOutput(FINISH_TAG, _emit_counts(counts))


def read_stubs(paths: Iterable[str]) -> list[DocStub]:
    """The :class:`DocStub` of every row of the spill files ``paths`` (their texts stay on disk).

    Memory: about 360 bytes a document with :func:`dedup_shard` (the tuple, the 64-character id, a ~40-character ref,
    two ints; ``source`` and ``language`` strings shared, the spill path shared per file), plus
    the kept fields' JSON where the source keeps any, measured by ``tests/data/test_clean_spill.py``.
    """
    stubs: list[DocStub] = []
    shared: dict[str, str] = {}  # one string object per distinct source / language value
    for path in paths:
        table = read_spill(path, [*STUB_COLUMNS, TEXT_BYTES])  # no text read
        ids, refs = table.column("id").to_pylist(), table.column("ref").to_pylist()
        sources = [shared.setdefault(v, v) for v in table.column("source").to_pylist()]
        languages = [shared.setdefault(v, v) for v in table.column("language").to_pylist()]
        fields = table.column("fields").to_pylist()
        nbytes = table.column(TEXT_BYTES).to_pylist()
        stubs.extend(map(DocStub, ids, refs, sources, languages, fields, repeat(path), count(), nbytes))
    return stubs


def dedup_shard(stubs: list[DocStub], near: dict[str, tuple[str, float]]) -> tuple[list[DocStub], list[dict], Counter]:
    """Exact and near dedup of one shard's stubs (:class:`WriteShardFn`'s rules).

    ``stubs`` is sorted in place by id (no per-id index: a stub costs no more than
    :func:`read_stubs` says). Returns ``(kept stubs in id order, removed rows, counts)``.
    """
    stubs.sort(key=attrgetter("id"))
    counts: Counter = Counter()
    removed: list[dict] = []
    kept: list[DocStub] = []
    for doc_id, copies in groupby(stubs, key=attrgetter("id")):
        group = sorted(copies, key=lambda d: (ref_sort_key(d.ref), d.ref, d.source, d.language))
        first = group[0]
        # exact copies of a near duplicate belong to the near cluster's survivor, a kept document
        cluster, detail = (near[doc_id][0], f"exact copy of {first.ref}, a near duplicate") if doc_id in near \
            else (doc_id, None)
        for dup in group[1:]:
            counts["duplicates.exact"] += 1
            removed.append(removed_row(dup.ref, "duplicate", "exact", cluster=cluster, detail=detail,
                                       fields=dup.fields))
        if doc_id in near:
            survivor, sim = near[doc_id]
            counts["duplicates.near"] += 1
            removed.append(removed_row(first.ref, "duplicate", "near", cluster=survivor, detail=f"jaccard={sim:.6f}",
                                       fields=first.fields))
        else:
            kept.append(first)
            counts[f"languages.{first.language}"] += 1
    counts["kept"] = len(kept)
    return kept, removed, counts


def shard_texts(stubs: list[DocStub]) -> pa.Array:
    """The texts of ``stubs`` (in their order) as one Arrow string array, each spill file read
    once, no Python string per document."""
    by_file: dict[str, list[int]] = defaultdict(list)
    for n, stub in enumerate(stubs):
        by_file[stub.spill].append(n)
    chunks, order = [], []
    for path, positions in sorted(by_file.items()):
        chunks.append(read_texts(path, [stubs[n].row for n in positions]))
        order.extend(positions)
    if not chunks:
        return pa.array([], type=pa.string())
    where = [0] * len(stubs)  # stubs[n]'s text is element where[n] of the concatenation
    for at, n in enumerate(order):
        where[n] = at
    return pa.concat_arrays(chunks).take(pa.array(where, type=pa.int64()))


def shard_chunks(kept: list[DocStub]) -> Iterable[list[DocStub]]:
    """``kept`` cut into the row groups of a document shard, in order: at most
    :data:`WRITE_ROWS` documents and :data:`WRITE_BYTES` bytes of text each (a document larger
    than that alone); a function of the documents, so the same shard gives the same row groups."""
    chunk: list[DocStub] = []
    size = 0
    for stub in kept:
        if chunk and (len(chunk) >= WRITE_ROWS or size + stub.nbytes > WRITE_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(stub)
        size += stub.nbytes
    yield chunk  # an empty shard: one empty row group, as a table of no rows writes


def write_shard(out: OutputDir, shard: int, shards: int, kept: list[DocStub]) -> str:
    """Write document shard ``shard`` of ``shards`` into ``out``: the ``kept`` documents
    (sorted by id), their texts read from the spill files one row group at a time
    (:func:`shard_chunks`), so memory holds one row group's texts, not the shard's. Returns its location."""
    tables = (pa.table({"id": [d.id for d in chunk], "text": shard_texts(chunk),
                        "source": [d.source for d in chunk], "ref": [d.ref for d in chunk],
                        "language": [d.language for d in chunk], "fields": [d.fields for d in chunk]},
                       schema=DOCUMENT_SCHEMA)
              for chunk in shard_chunks(kept))
    name = shard_name(shard, shards)
    with out.file(name) as path:
        write_parquet_chunks(tables, DOCUMENT_SCHEMA, path)
    return out.uri_of(name)


def near_by_shard(removed: tuple[str, tuple[str, float]], shards: int) -> tuple[int, tuple[str, tuple[str, float]]]:
    """A near duplicate ``(id, (survivor id, jaccard))`` keyed by its shard (:func:`shard_of`), to meet
    the shard's spill files in the shard writer's join."""
    return shard_of(removed[0], shards), removed


class WriteShardFn(beam.DoFn):
    """``(shard, {"docs": [spill file...], "near": [(id, (survivor id, jaccard))...]})`` -> writes the
    shard's file, sorted by id.

    Of each id the lowest ref (:func:`tidal.data.sources.ref_sort_key`) is kept and the other
    copies are exact duplicates of cluster ``id``; a kept id named in ``near`` (the near duplicates of
    this shard, joined by shard: no worker holds another shard's) is a near duplicate, and then its exact copies
    name that survivor as their cluster too (every cluster id is a kept document's). Outputs finish items
    (module docstring): the removed rows, the counts (``kept``, ``languages.<lang>``,
    ``duplicates.exact|near``) and the shard number. The stubs and then the texts of the kept
    documents are read from the spill files. A shard no document went to is written by :class:`FinishFn`.
    """

    def __init__(self, out: OutputDir, shards: int):
        self.out = out
        self.shards = shards

    def process(self, element: tuple) -> Iterable:
        shard, joined = element
        paths = list(joined["docs"])
        if not paths:  # a shard no document went to: FinishFn writes it
            return
        kept, removed, counts = dedup_shard(read_stubs(sorted(set(paths))), dict(joined.get("near", ())))
        write_shard(self.out, shard, self.shards, kept)
        if removed:
            yield REMOVED_TAG, removed
        yield _emit_counts(counts)
        yield SHARD_TAG, shard


def write_rows(rows: Iterable[dict[str, Any]], out: OutputDir, name: str, schema: pa.Schema) -> str:
    """Write row dicts (keys: ``schema``'s names) to one Parquet file ``name`` of ``out``, sorted by
    ref (:func:`tidal.data.sources.ref_sort_key`, then the ref string). Returns its location."""
    rows = sorted(rows, key=lambda r: (ref_sort_key(r["ref"]), r["ref"]))
    table = pa.table({column: [r[column] for r in rows] for column in schema.names}, schema=schema)
    with out.file(name) as path:
        write_parquet(table, path)
    return out.uri_of(name)


def sum_counts(dicts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Sum outcome-count dicts key by key."""
    total: Counter = Counter()
    for d in dicts:
        total.update(d)
    return dict(total)


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
        "neardup": {"candidate_pairs": 0, "verified_pairs": 0, "oversized_buckets": 0, "pairs_not_proposed": 0},
    }
    for key, n in sorted(totals.items()):
        group, _, name = key.partition(".")
        if group in GROUPS:
            bucket = out[GROUPS[group]]
            bucket[name] = bucket.get(name, 0) + n
    out["duplicates"] = sum(out["duplicates_by_kind"].values())
    return out


class FinishFn(beam.DoFn):
    """One element (an ``Impulse``) and, as side inputs, every finish item of the job (module
    docstring), in one or more iterables -> writes the empty document shards no document
    went to, ``quarantine.parquet`` and ``removed.parquet`` (:func:`write_rows`) and
    ``counts.json`` (the summed counts, :func:`counts_from_totals`), then removes the spill files.

    Side inputs are complete before the element is processed, so this runs once, after every
    shard writer: the spill files are no longer needed, and removing them here, inside the job,
    also covers a job that a Beam provider launched on a cluster (:mod:`tidal.core.beam_job`).
    (Beam's own file sinks finalize the same way: one element, the results as side inputs.)
    """

    def __init__(self, out: OutputDir, shards: int, rules: list[str], spill: OutputDir):
        self.out = out
        self.shards = shards
        self.rules = rules
        self.spill = spill

    def process(self, _: Any, *item_lists: Iterable) -> Iterable:
        rows: dict[str, list[dict]] = {QUARANTINE_TAG: [], REMOVED_TAG: []}
        totals: list[dict[str, int]] = []
        written: set[int] = set()
        for items in item_lists:
            for item in items:
                if isinstance(item, dict):
                    totals.append(item)
                elif item[0] == SHARD_TAG:
                    written.add(item[1])
                else:
                    rows[item[0]] += item[1]
        for shard in sorted(set(range(self.shards)) - written):
            write_shard(self.out, shard, self.shards, [])
        write_rows(rows[QUARANTINE_TAG], self.out, QUARANTINE_FILE, QUARANTINE_SCHEMA)
        write_rows(rows[REMOVED_TAG], self.out, REMOVED_FILE, REMOVED_SCHEMA)
        counts = counts_from_totals(sum_counts(totals), self.rules)
        path = self.out.write_text(COUNTS_FILE, json.dumps(counts, indent=1, sort_keys=True) + "\n")
        self.spill.remove()
        yield path
