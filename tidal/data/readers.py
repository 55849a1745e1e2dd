"""Readers for files outside registry archives: JSONL (plain, .gz, .zst), Parquet, plain text.

Invariant: a reader never stops at a bad record and never drops one silently. Every record
it meets becomes either a good record ``(ref, raw bytes)`` or a quarantined one
``(ref, raw bytes verbatim, reason, detail)``; the fetch step writes both into
``raw.parquet`` and the clean step counts the quarantined ones under their reason. Files
with no record at all (zero bytes, zero rows) are counted in ``skipped`` as ``empty_file``.

``path`` is a local file or folder, or an ``s3://bucket/key`` object or ``s3://bucket/prefix/``
"folder"; a folder is read recursively, its files in natural order of their relative path
(:func:`tidal.data.sources.ref_sort_key`), hidden files and folders (``.name``) skipped.
Symlinked folders and files are followed, under the name the link has in the folder (a
file's relative name is as seen through the link, not its target's). A symlink that leads
back into a folder already being walked (a cycle) is a ``ValueError`` naming the link and that
folder; a broken symlink is a ``FileNotFoundError`` naming the link; a folder that cannot be
listed raises too (nothing is skipped silently). S3 objects
are listed (paginated) and downloaded one at a time into a temporary directory with the
storage layer's client (:func:`tidal.storage.s3.s3_client`: endpoint from
``TIDAL_S3_ENDPOINT_URL`` or boto3's own settings, credentials from boto3's chain, adaptive
retries), read, then deleted; the refs are the same as for a local copy of the prefix.

Refs: JSONL ``rel/path.jsonl.gz:LINE`` (1-based line), Parquet ``rel/path.parquet:ROW``
(0-based row), text ``rel/path.txt`` (one document per file). ``rel/path`` is relative to
``path`` (the file name when ``path`` is a file).

Quarantine reasons: ``malformed_json`` (a line that is not JSON, or nested deeper than the parser's
recursion limit), ``not_an_object`` (JSON
that is not an object), ``missing_text_field`` (no string under ``text_field``; a null too),
``truncated_file`` (a compressed stream that ends early or is corrupt: the records read
before are kept, the partial tail is quarantined), ``unreadable_file`` (a Parquet file
pyarrow cannot open; the whole file's bytes are quarantined). A field the recipe names that a
file lacks altogether (a Parquet column; a key no JSON object of the file has) is not bad data
but a mistake in the recipe: :class:`tidal.data.record_fields.SourceError` names the file,
the field and what the file has. Each record also carries its kept fields (its own id and
``keep_fields``: :mod:`tidal.data.record_fields`) as ``fields``.

Text inside JSON is turned back into bytes with ``surrogateescape`` (bytes that were not
UTF-8 come back unchanged), or ``surrogatepass`` for lone surrogates from ``\\ud800``
escapes, so the clean step's invalid-UTF-8 policy decides about them, not the reader.

Snapshot hash: with ``digests`` given, :func:`read_path` appends ``(relative name, sha256 of
the file's bytes, size in bytes)`` for every file as it starts reading it (S3: of the
downloaded object); :func:`snapshot_sha256` folds that list into one hex digest, the sha256
of ``"<file sha256>  <relative name>\n"`` lines in read order (``sha256sum``'s format). A
recipe pins a file source with it (``sources.<name>.snapshot_sha256``, checked by fetch).
Each file is read twice, hashed then parsed (streaming, never whole in memory), so
:func:`read_path` takes its ``os.stat`` (size, mtime_ns, device, inode) before hashing and
again when its reader finished, and raises ``ValueError`` naming the file if they differ: it
changed while fetch read it and the hash may not describe the records; rerun the step. Not
seen: a same-size rewrite in place within the file system's timestamp granularity (a few
ms). A caller that stops early (``max_documents``: fetch) closes the reader, which then checks
the last file it read (``close()`` raises the ``ValueError``).
S3 objects are downloaded to a private temporary file first, one
version each (ranged parts are fetched with ``If-Match`` on the ETag), so both reads see
the same bytes.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.data.file_list import list_files
from tidal.data.readers_s3 import read_s3
from tidal.data.record_fields import FieldSpec, JsonlFieldCheck
from tidal.data.snapshot import READ_CHUNK_BYTES, file_sha256

PATH_FORMATS = ("jsonl", "parquet", "text")
READ_REASONS = ("malformed_json", "not_an_object", "missing_text_field", "truncated_file", "unreadable_file")


@dataclass(frozen=True)
class ReadRecord:
    """One record met by a reader.

    Attributes:
        ref: where it is (module docstring).
        raw: the document's bytes, or for a quarantined record the verbatim input bytes.
        reason: ``None`` for a good record, else one of :data:`READ_REASONS`.
        detail: human-readable explanation naming file, line/row and rule (empty if good).
        fields: the record's kept fields as JSON (:meth:`FieldSpec.record_fields`), or ``None``.
    """

    ref: str
    raw: bytes
    reason: str | None = None
    detail: str = ""
    fields: str | None = None


class TruncatedStream(Exception):
    """A compressed stream ended before its end marker, or is corrupt."""


def _to_bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="surrogatepass")


def _chunks(path: Path) -> Iterator[bytes]:
    """Decompressed bytes of ``path`` by chunk (by extension: ``.gz``, ``.zst``, else plain).

    Raises:
        TruncatedStream: after the last good bytes, when the stream ends early or is corrupt
            (multi-member gzip and multi-frame zstd are read through).
    """
    name = path.name
    with open(path, "rb") as handle:
        if name.endswith(".gz"):
            yield from _decompressed(handle, lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), zlib.error,
                                     "corrupt gzip data", "gzip stream ends before its end marker")
        elif name.endswith(".zst"):
            import zstandard

            yield from _decompressed(handle, lambda: zstandard.ZstdDecompressor().decompressobj(),
                                     zstandard.ZstdError, "corrupt zstd data", "zstd frame ends before its end")
        else:
            yield from iter(lambda: handle.read(READ_CHUNK_BYTES), b"")


def _decompressed(handle, new: Callable[[], Any], error: type[Exception], corrupt: str,
                  unfinished: str) -> Iterator[bytes]:
    """Decompressed chunks of ``handle`` through decompressors made by ``new``, reading through
    concatenated members/frames. A zero-byte file holds no stream: empty, not truncated.

    Raises:
        TruncatedStream: ``corrupt`` when ``error`` is raised; ``unfinished`` when the data
            ends inside a member/frame.
    """
    d = new()
    started = False
    try:
        for chunk in iter(lambda: handle.read(READ_CHUNK_BYTES), b""):
            started = True
            while chunk:
                yield d.decompress(chunk)
                chunk = d.unused_data if d.eof else b""
                if d.eof and chunk:
                    d = new()
        yield d.flush()
    except error as err:
        raise TruncatedStream(f"{corrupt}: {err}") from None
    if started and not d.eof:
        raise TruncatedStream(unfinished)


def _lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number from 1, line bytes without the newline, complete)``; the last item has
    ``complete=False`` when the stream was truncated (its bytes are the partial tail).

    The pieces of an unfinished line are kept in a list and joined once, so a line spanning
    many chunks (a 50 MB document on one line) costs linear, not quadratic, time."""
    parts: list[bytes] = []  # pieces of the current unfinished line
    number = 0
    try:
        for chunk in _chunks(path):
            if b"\n" not in chunk:
                parts.append(chunk)
                continue
            whole = chunk.split(b"\n")
            parts.append(whole[0])
            whole[0] = b"".join(parts)
            parts = [whole.pop()]
            for line in whole:
                number += 1
                yield number, line, True
    except TruncatedStream:
        yield number + 1, b"".join(parts), False
        return
    buffer = b"".join(parts)
    if buffer:
        yield number + 1, buffer, True


def read_jsonl(path: Path, rel: str, spec: FieldSpec, skipped: Counter) -> Iterator[ReadRecord]:
    """One record per non-blank line of a JSON Lines file: the string under ``spec.text``.

    Blank lines (only whitespace) are not records and are counted as ``blank_line`` in
    ``skipped``; CRLF line ends are accepted (the ``\\r`` is JSON whitespace). A UTF-8
    byte-order mark before the first line (Windows editors write one) is not part of the JSON
    and is dropped; anywhere else it is data (the line is ``malformed_json``).

    Raises:
        SourceError: at the end of the file (or when the caller stops early), if no JSON
            object of it held a field ``spec`` requires (:class:`JsonlFieldCheck`).
    """
    check = JsonlFieldCheck(spec, rel)
    try:
        yield from _jsonl_records(path, rel, spec, skipped, check)
    except GeneratorExit:  # stopped early (max_documents): what was read must hold the fields too
        check.finish()
        raise
    check.finish()


def _jsonl_records(path: Path, rel: str, spec: FieldSpec, skipped: Counter,
                   check: JsonlFieldCheck) -> Iterator[ReadRecord]:
    """:func:`read_jsonl`'s records; each JSON object is shown to ``check``."""
    text_field = spec.text
    count = 0
    for number, line, complete in _lines(path):
        ref = f"{rel}:{number}"
        if not complete:
            count += 1
            yield ReadRecord(ref, line, "truncated_file", f"{rel} line {number}: compressed stream ends early "
                             f"or is corrupt; {len(line)} partial bytes quarantined, lines before are kept")
            break
        if number == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8):]
        if not line.strip():
            skipped["blank_line"] += 1
            continue
        count += 1
        try:
            obj = json.loads(line.decode("utf-8", errors="surrogateescape"))
        except json.JSONDecodeError as err:
            yield ReadRecord(ref, line, "malformed_json", f"{rel} line {number}: {err}")
            continue
        except RecursionError:  # the C parser recurses per nesting level: '[[[[…' past the interpreter's limit
            yield ReadRecord(ref, line, "malformed_json", f"{rel} line {number}: nested deeper than the JSON "
                             f"parser's limit ({sys.getrecursionlimit()} levels)")
            continue
        if not isinstance(obj, dict):
            yield ReadRecord(ref, line, "not_an_object",
                             f"{rel} line {number}: JSON {type(obj).__name__}, not an object")
            continue
        check.seen(obj)
        text = obj.get(text_field)
        if not isinstance(text, str):
            yield ReadRecord(ref, line, "missing_text_field",
                             f"{rel} line {number}: no string field {text_field!r} (got {type(text).__name__})",
                             spec.record_fields(obj))
            continue
        yield ReadRecord(ref, _to_bytes(text), fields=spec.record_fields(obj))
    if count == 0:
        skipped["empty_file"] += 1


def read_parquet(path: Path, rel: str, spec: FieldSpec, skipped: Counter) -> Iterator[ReadRecord]:
    """One record per row of a Parquet file: the string column ``spec.text``, read by row group.

    A zero-byte or zero-row file is counted as ``empty_file``; a file pyarrow cannot open is
    one ``unreadable_file`` record; a row whose field is null or not a string is
    ``missing_text_field`` with the row as JSON for its raw bytes.

    Raises:
        SourceError: the file has no column for a field ``spec`` requires
            (:meth:`FieldSpec.check_columns`).
    """
    import pyarrow.parquet as pq

    text_field = spec.text
    if path.stat().st_size == 0:
        skipped["empty_file"] += 1
        return
    try:
        parquet = pq.ParquetFile(path)
        columns = parquet.schema_arrow.names
    except Exception as err:  # noqa: BLE001 - any pyarrow failure quarantines the file, named
        yield ReadRecord(f"{rel}:0", path.read_bytes(), "unreadable_file", f"{rel}: {type(err).__name__}: {err}")
        return
    spec.check_columns(rel, columns)
    row = 0
    for group in range(parquet.num_row_groups):
        table = parquet.read_row_group(group)
        for record in table.to_pylist():
            value = record.get(text_field)
            ref = f"{rel}:{row}"
            kept = spec.record_fields(record)
            if isinstance(value, str):
                yield ReadRecord(ref, _to_bytes(value), fields=kept)
            elif isinstance(value, bytes):
                yield ReadRecord(ref, value, fields=kept)
            else:
                raw = json.dumps(record, default=repr, sort_keys=True,
                                 ensure_ascii=False).encode("utf-8", "surrogatepass")
                yield ReadRecord(ref, raw, "missing_text_field",
                                 f"{rel} row {row}: {text_field!r} is {type(value).__name__}, not a string", kept)
            row += 1
    if row == 0:
        skipped["empty_file"] += 1


def read_text(path: Path, rel: str, spec: FieldSpec, skipped: Counter) -> Iterator[ReadRecord]:
    """One document per file, its bytes verbatim (decompressed for ``.gz`` / ``.zst``).

    A zero-byte file is counted as ``empty_file`` (it holds no document); a truncated
    compressed file is one ``truncated_file`` record holding the bytes read.
    """
    parts: list[bytes] = []
    try:
        parts.extend(_chunks(path))  # chunks read before a truncation stay in parts
    except TruncatedStream as err:
        yield ReadRecord(rel, b"".join(parts), "truncated_file", f"{rel}: {err}")
        return
    data = b"".join(parts)
    if not data:
        skipped["empty_file"] += 1
        return
    yield ReadRecord(rel, data)


_READERS = {"jsonl": read_jsonl, "parquet": read_parquet, "text": read_text}


def read_path(fmt: str, path: str | Path, text_field: str | FieldSpec = "text", skipped: Counter | None = None,
              digests: list[tuple[str, str, int]] | None = None) -> Iterator[ReadRecord]:
    """Every record of the files under ``path`` in format ``fmt``, file by file in ref order.

    Args:
        fmt: one of :data:`PATH_FORMATS`.
        path: a local file or folder (module docstring).
        text_field: JSON key / Parquet column holding the document text, or a
            :class:`~tidal.data.record_fields.FieldSpec` (the text and the fields to keep).
        skipped: receives ``reason -> n`` for things that are not records (empty files,
            blank JSONL lines).
        digests: receives ``(relative name, sha256, bytes)`` of each file as its reading
            starts (module docstring: snapshot hash); a caller that stops early gets the
            files it read.

    Raises:
        ValueError: unknown format or a URI scheme other than ``s3://``; a symlink cycle
            under ``path`` (:func:`list_files`); a file that changed while it was read (its
            size, mtime or inode after its reader finished differ from before it was hashed),
            raised after that file's last record.
        SourceError: a file lacks a field the spec requires (:mod:`tidal.data.record_fields`).
        FileNotFoundError: missing path, a broken symlink under it, or an S3 prefix with no
            object. botocore errors for S3 access.
    """
    if fmt not in _READERS:
        raise ValueError(f"unknown path format {fmt!r}; known: {PATH_FORMATS}")
    skipped = skipped if skipped is not None else Counter()
    spec = text_field if isinstance(text_field, FieldSpec) else FieldSpec(text_field)
    if str(path).startswith("s3://"):
        yield from read_s3(fmt, str(path), spec, skipped, digests, read_file)
        return
    for rel, full in list_files(path):
        yield from read_file(fmt, full, rel, spec, skipped, digests)


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    """``(size, mtime_ns, st_dev, st_ino)`` of ``path`` through symlinks; ``None`` if it is gone."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_size, info.st_mtime_ns, info.st_dev, info.st_ino


def read_file(fmt: str, full: Path, rel: str, spec: FieldSpec, skipped: Counter,
               digests: list[tuple[str, str, int]] | None) -> Iterator[ReadRecord]:
    """Hash (with ``digests``) then parse one file (its name relative to the source ``rel``),
    checking it did not change in between.

    Raises:
        ValueError: the file's size, mtime or inode after its reader finished differ from
            before it was hashed (or it is gone): it changed while fetch read it.
    """
    before = _identity(full)
    if digests is not None:
        digests.append((rel, *file_sha256(full)))
    try:
        yield from _READERS[fmt](full, rel, spec, skipped)
    except GeneratorExit:  # a caller that stopped early (max_documents) closed the reader: check too
        _check_unchanged(full, before)
        raise
    _check_unchanged(full, before)


def _check_unchanged(full: Path, before: tuple[int, int, int, int] | None) -> None:
    """Raise ``ValueError`` if ``full``'s :func:`_identity` is no longer ``before``."""
    after = _identity(full)
    if after != before:
        fields = ("size", "mtime_ns", "device", "inode")
        what = ("it is gone" if after is None else "it appeared" if before is None else ", ".join(
            f"{field} {old} -> {new}" for field, old, new in zip(fields, before, after) if old != new))
        raise ValueError(f"{full} changed while fetch read it ({what}): the records read and its sha256 "
                         "may describe different bytes; rerun the step once the files stay put")
