"""A committed step's files, read in place: listing, whole small files, byte ranges, parquet columns.

Invariant (docs/architecture.md section 0): a step reads its committed inputs where they live (a local
directory or a prefix in the bucket) and fetches only the bytes it uses: a parquet reader gets a
random-access file, so it fetches the footer and the column chunks of the columns and row groups
it reads; a ``.npy`` of token rows is a header then row-major data, so rows are byte ranges
(:class:`NpyRows`). Nothing is downloaded whole unless a library needs a path
(:meth:`StepFiles.local_copy`). On a local root every read is a plain file read and
:meth:`StepFiles.array` is ``np.load(mmap_mode="r")``, as fast as reading the directory.

A committed step never changes (its id names its bytes), so a listing is taken once per
:class:`StepFiles` object and reused. Whole-file reads from a bucket (:meth:`StepFiles.read_bytes`,
:meth:`StepFiles.local_copy`) are checked against the step's ``manifest.json`` (size and sha256)
when it lists the file, as :meth:`tidal.storage.Storage.input_dir` checks a downloaded copy;
range reads and parquet reads are not hashed (that would mean reading the whole file).
:meth:`StepFiles.sha256` streams a file through sha256 in chunks and checks nothing: it is what
``tidal verify`` compares with the manifest (after a fresh :meth:`StepFiles.list_files`).

Filesystems are ``pyarrow.fs``: :class:`pyarrow.fs.LocalFileSystem` for a path (or ``file://``),
:class:`pyarrow.fs.S3FileSystem` for ``s3://`` (endpoint from ``TIDAL_S3_ENDPOINT_URL``,
:func:`tidal.settings.current`; region and credentials from the AWS chain that boto3 also reads:
``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID`` ..., default region ``us-east-1``), one per
(endpoint, region) per process; any other scheme (``gs://``) through
:func:`pyarrow.fs.FileSystem.from_uri`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from tidal.files.counting import CountingReader, bytes_fetched, count, ranged_gets
from tidal.files.npy import NpyRows
from tidal.files.retry import with_retries
from tidal.settings import current as current_settings
from tidal.storage.layout import MANIFEST_JSON

DEFAULT_REGION = "us-east-1"
COPY_CHUNK_BYTES = 8 << 20  # local_copy streams in chunks of this size (and sha256 from a bucket: one GET each)
LOCAL_HASH_CHUNK_BYTES = 1 << 20  # sha256 of a local file reads chunks of this size (as integrity.hashing)
S3_MAX_ATTEMPTS = 8  # AWS standard retry strategy (exponential backoff with jitter) on 5xx / throttling
S3_CONNECT_TIMEOUT_S = 10.0
S3_REQUEST_TIMEOUT_S = 60.0  # honoured by the AWS SDK on some platforms only (pyarrow.fs.S3FileSystem docs)

_lock = threading.Lock()
_filesystems: dict[tuple[str | None, str], pafs.FileSystem] = {}


def is_uri(location: str | Path) -> bool:
    """True for ``s3://…`` / ``gs://…`` locations (a bucket), False for a local path (``file://`` is local)."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def _region() -> str:
    import botocore.session

    return botocore.session.get_session().get_config_variable("region") or DEFAULT_REGION


GCS_S3_ENDPOINT = "https://storage.googleapis.com"  # gs:// roots: GCS's S3-interoperable XML API (HMAC keys)


def s3_filesystem(scheme: str = "s3") -> pafs.S3FileSystem:
    """This process's :class:`pyarrow.fs.S3FileSystem` for the current endpoint and region (made once
    per (endpoint, region)); credentials come from pyarrow's default AWS chain (environment, files).
    A ``gs://`` root goes to GCS's S3-interoperable endpoint unless ``TIDAL_S3_ENDPOINT_URL`` is set,
    as the storage layer does (tidal/storage/s3.py ``scheme_settings``)."""
    endpoint = current_settings().s3_endpoint_url or (GCS_S3_ENDPOINT if scheme == "gs" else None)
    region = "auto" if scheme == "gs" and not current_settings().s3_endpoint_url else _region()
    key = (endpoint, region)
    with _lock:
        if key not in _filesystems:
            kwargs: dict[str, Any] = {"region": region, "connect_timeout": S3_CONNECT_TIMEOUT_S,
                                      "request_timeout": S3_REQUEST_TIMEOUT_S,
                                      "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS)}
            if endpoint:
                parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
                kwargs |= {"endpoint_override": parsed.netloc, "scheme": parsed.scheme or "https"}
            _filesystems[key] = pafs.S3FileSystem(**kwargs)
        return _filesystems[key]



class StepFiles:
    """The files of one committed step, read in place. Build it with :meth:`open`.

    Attributes:
        uri: the step's location as given, without a trailing ``/``: a local directory path or a
            bucket URI (``s3://bucket/root/{step_id}``); messages name files as ``{uri}/{name}``.
        remote: True for a bucket (reads are counted by :func:`bytes_fetched`).
    """

    def __init__(self, uri: str, filesystem: pafs.FileSystem, base: str, remote: bool):
        self.uri, self.remote = uri, remote
        self._fs, self._base = filesystem, base
        self._listing: dict[str, int] | None = None
        self._manifest: dict[str, dict[str, Any]] | None = None
        self._handles: dict[str, pa.NativeFile] = {}
        self._handle_lock = threading.Lock()

    @classmethod
    def open(cls, location: str | Path | StepFiles) -> StepFiles:
        """The files under ``location``: a local directory (``Path``, path string or ``file://``) or a
        bucket prefix (``s3://bucket/root/{step_id}/``). A :class:`StepFiles` is returned as is.
        Opening reads nothing.

        Raises:
            ValueError: a bucket URI without a bucket; pyarrow's error for an unsupported scheme.
        """
        if isinstance(location, StepFiles):
            return location
        text = str(location)
        if not is_uri(text):
            path = os.path.abspath(text.removeprefix("file://"))
            return cls(str(location).removeprefix("file://").rstrip("/") or "/", pafs.LocalFileSystem(), path, False)
        uri = text.rstrip("/")
        parsed = urlparse(uri)
        if not parsed.netloc:
            raise ValueError(f"{text!r}: a bucket URI needs a bucket (s3://bucket/prefix)")
        if parsed.scheme in ("s3", "gs"):
            return cls(uri, s3_filesystem(parsed.scheme), f"{parsed.netloc}{parsed.path}".rstrip("/"), True)
        filesystem, base = pafs.FileSystem.from_uri(uri)
        return cls(uri, filesystem, base.rstrip("/"), True)

    @classmethod
    def of_file(cls, location: str | Path) -> tuple[StepFiles, str]:
        """``(StepFiles of the directory holding it, its name)`` for one file's location (a path or
        a URI such as ``s3://bucket/root/step/documents-00000-of-00002.parquet``)."""
        text = str(location)
        if not is_uri(text):
            path = Path(text.removeprefix("file://"))
            return cls.open(path.parent), path.name
        parent, _, name = text.rstrip("/").rpartition("/")
        return cls.open(parent), name

    def __repr__(self) -> str:
        return f"StepFiles({self.uri!r})"

    # -- names -------------------------------------------------------------------------------
    def uri_of(self, name: str) -> str:
        """Where file ``name`` lives: ``{uri}/{name}`` (a local path on a local root)."""
        return f"{self.uri.rstrip('/')}/{name}"

    def _path(self, name: str) -> str:
        return f"{self._base}/{name}"

    def _list(self) -> dict[str, int]:
        selector = pafs.FileSelector(self._base, recursive=True, allow_not_found=True)
        start = len(self._base) + 1
        return {info.path[start:]: info.size for info in self._fs.get_file_info(selector)
                if info.type == pafs.FileType.File}

    def _listed(self) -> dict[str, int]:
        if self._listing is None:
            self._listing = self._list()
        return self._listing

    def list_files(self) -> dict[str, int]:
        """Every file under the step as stored now: name (as :meth:`names`) -> size in bytes.

        Unlike :meth:`names` this lists afresh (one paginated listing on a bucket) rather than
        reuse a kept listing, for ``tidal verify``, which checks that the step did not change;
        the fresh listing is then the one kept. An absent step lists as ``{}``."""
        self._listing = self._list()
        return dict(self._listing)

    def names(self, pattern: str = "*") -> list[str]:
        """Sorted names (relative to the step, ``/``-separated) of every file matching ``pattern``
        (:func:`fnmatch.fnmatchcase`; ``*`` also matches ``/``). The step is listed once (one
        paginated listing on a bucket) and the listing is kept: a committed step never changes."""
        return sorted(n for n in self._listed() if fnmatch.fnmatchcase(n, pattern))

    def _info_size(self, name: str) -> int | None:
        if self._listing is not None:
            return self._listing.get(name)
        info = self._fs.get_file_info(self._path(name))
        return info.size if info.type == pafs.FileType.File else None

    def exists(self, name: str) -> bool:
        """True if file ``name`` exists (a directory does not count)."""
        return self._info_size(name) is not None

    def size(self, name: str) -> int:
        """Size of file ``name`` in bytes.

        Raises:
            FileNotFoundError: naming ``{uri}/{name}``.
        """
        size = self._info_size(name)
        if size is None:
            raise self._missing(name)
        return int(size)

    def _missing(self, name: str) -> FileNotFoundError:
        return FileNotFoundError(f"{self.uri_of(name)} does not exist")

    def local_path(self, name: str) -> Path | None:
        """The file itself on a local root (for ``np.load(mmap_mode="r")`` and the like); None for a
        bucket. The file need not exist."""
        return None if self.remote else Path(self._base) / name

    # -- whole files -------------------------------------------------------------------------
    def read_bytes(self, name: str, *, checked: bool = True) -> bytes:
        """The whole file ``name`` (from a bucket: one GET, checked against ``manifest.json``
        unless ``checked=False``: ``tidal verify`` reads the bytes as stored and reports any
        difference itself, even with a damaged manifest).

        Raises:
            FileNotFoundError: naming ``{uri}/{name}``.
            OSError: the bytes differ from the manifest's size or sha256 (names the file).
        """
        local = self.local_path(name)
        if local is not None:
            try:
                return local.read_bytes()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                raise self._missing(name) from None
        try:
            data = with_retries(lambda: self._read_whole(name), what=self.uri_of(name))
        except OSError:
            if not self.exists(name):
                raise self._missing(name) from None
            raise
        count(len(data))
        if checked:
            self._verify(name, len(data), hashlib.sha256(data).hexdigest())
        return data

    def read_verified(self, name: str) -> bytes:
        """The whole file ``name``, checked against ``manifest.json`` on any root, local too: for a
        reader that shows or trusts the bytes outside a step run, whose inputs are checked first
        (the on-call page's ``results.json``).

        Raises:
            FileNotFoundError: naming ``{uri}/{name}``.
            OSError: ``name`` is not in ``manifest.json`` (or there is none), or its size or sha256
                differ from it (names the file).
        """
        data = self.read_bytes(name, checked=False)
        if name not in self._manifest_entries():
            raise OSError(f"{self.uri_of(name)}: not listed in {MANIFEST_JSON}; not trusted")
        self._verify(name, len(data), hashlib.sha256(data).hexdigest())
        return data

    def _read_whole(self, name: str) -> bytes:
        with self._fs.open_input_stream(self._path(name)) as stream:
            return stream.read()

    def sha256(self, name: str) -> tuple[str, int]:
        """``(hex sha256, bytes hashed)`` of file ``name`` as stored now, streamed: a local file in
        :data:`LOCAL_HASH_CHUNK_BYTES` reads, a bucket object in :data:`COPY_CHUNK_BYTES` ranged GETs,
        never held whole in memory. Not checked against ``manifest.json`` (this is the check).

        Raises:
            FileNotFoundError: naming ``{uri}/{name}``.
        """
        chunk_bytes = COPY_CHUNK_BYTES if self.remote else LOCAL_HASH_CHUNK_BYTES

        def attempt() -> tuple[str, int]:  # a retry starts the stream and the hash over
            digest, size = hashlib.sha256(), 0
            with self.open_stream(name) as stream:
                while chunk := stream.read(chunk_bytes):
                    if self.remote:
                        count(len(chunk))
                    digest.update(chunk)
                    size += len(chunk)
            return digest.hexdigest(), size

        return with_retries(attempt, what=self.uri_of(name)) if self.remote else attempt()

    def open_stream(self, name: str) -> Any:
        """A sequential reader of ``name`` (a plain file on a local root, a buffered stream from a
        bucket: reads are not counted); FileNotFoundError names it."""
        local = self.local_path(name)
        if local is not None:
            try:
                return open(local, "rb")
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                raise self._missing(name) from None
        try:
            return self._fs.open_input_stream(self._path(name), buffer_size=COPY_CHUNK_BYTES)
        except OSError:
            if not self.exists(name):
                raise self._missing(name) from None
            raise

    def read_text(self, name: str) -> str:
        """File ``name`` decoded as UTF-8 (see :meth:`read_bytes` for errors)."""
        return self.read_bytes(name).decode("utf-8")

    def read_json(self, name: str) -> Any:
        """File ``name`` parsed as JSON.

        Raises:
            FileNotFoundError: naming ``{uri}/{name}``.
            ValueError: not valid JSON, naming ``{uri}/{name}`` and the position.
        """
        try:
            return json.loads(self.read_bytes(name))
        except json.JSONDecodeError as err:
            raise ValueError(f"{self.uri_of(name)}: not valid JSON: {err}") from None

    def _manifest_entries(self) -> dict[str, dict[str, Any]]:
        if self._manifest is None:
            self._manifest = {}
            if name_size := self._info_size(MANIFEST_JSON):
                data = with_retries(lambda: self._read_whole(MANIFEST_JSON), what=self.uri_of(MANIFEST_JSON))
                count(len(data))
                try:
                    self._manifest = {e["path"]: e for e in json.loads(data)["files"]}
                except (ValueError, KeyError, TypeError):
                    raise OSError(f"{self.uri_of(MANIFEST_JSON)}: not a manifest ({name_size} bytes)") from None
        return self._manifest

    def _verify(self, name: str, size: int, sha256: str) -> None:
        if name == MANIFEST_JSON:
            return
        entry = self._manifest_entries().get(name)
        if entry is not None and (entry["bytes"] != size or entry["sha256"] != sha256):
            raise OSError(f"{self.uri_of(name)}: {size} bytes with sha256 {sha256[:12]}, but {MANIFEST_JSON} "
                          f"says {entry['bytes']} bytes with sha256 {entry['sha256'][:12]}; the bucket object "
                          "is damaged or was overwritten (a committed step never changes)")

    def local_copy(self, name: str, dest_dir: str | Path) -> Path:
        """A local file with the bytes of ``name``, for a library that needs a path.

        On a local root this is the file itself (nothing is copied). From a bucket the file is
        streamed into ``dest_dir/name`` (parents made; written to a temporary sibling and renamed,
        so a reader never sees part of it) and checked against ``manifest.json``.

        Raises:
            FileNotFoundError: naming ``{uri}/{name}``.
            OSError: the bytes differ from the manifest (the partial copy is removed).
        """
        local = self.local_path(name)
        if local is not None:
            if not local.is_file():
                raise self._missing(name)
            return local
        target = Path(dest_dir) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")

        def attempt() -> tuple[int, str]:  # a retry starts the download over
            digest, size = hashlib.sha256(), 0
            try:
                stream = self._fs.open_input_stream(self._path(name))
            except OSError:
                if not self.exists(name):
                    raise self._missing(name) from None
                raise
            with stream, open(tmp, "wb") as out:
                while chunk := stream.read(COPY_CHUNK_BYTES):
                    count(len(chunk))
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            return size, digest.hexdigest()

        try:
            self._verify(name, *with_retries(attempt, what=self.uri_of(name)))
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return target

    # -- in place ----------------------------------------------------------------------------
    def open_input(self, name: str) -> Any:
        """A random-access file of ``name`` for ``pq.ParquetFile(...)`` / ``pq.read_table(...)``
        (a :class:`pyarrow.NativeFile` on a local root; from a bucket a :class:`pyarrow.PythonFile`
        that counts the bytes it fetches). Close it (``with files.open_input(name) as f:``).

        Raises:
            FileNotFoundError: naming ``{uri}/{name}``.
        """
        try:
            raw = self._fs.open_input_file(self._path(name))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._missing(name) from None
        except OSError:
            if not self.exists(name):
                raise self._missing(name) from None
            raise
        return pa.PythonFile(CountingReader(raw, self.uri_of(name)), mode="r") if self.remote else raw

    def _handle(self, name: str) -> pa.NativeFile:
        with self._handle_lock:
            if name not in self._handles:
                try:
                    self._handles[name] = self._fs.open_input_file(self._path(name))
                except OSError:
                    if not self.exists(name):
                        raise self._missing(name) from None
                    raise
            return self._handles[name]

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``name`` from byte ``offset`` (fewer at the end of the file; one
        ranged GET on a bucket). The file stays open on this object for further ranges;
        thread-safe.

        Raises:
            ValueError: a negative offset or length.
            FileNotFoundError: naming ``{uri}/{name}``.
        """
        if offset < 0 or length < 0:
            raise ValueError(f"{self.uri_of(name)}: range offset {offset} length {length} must be >= 0")
        if length == 0:
            return b""
        handle = self._handle(name)
        data = with_retries(lambda: handle.read_at(length, offset),
                            what=f"{self.uri_of(name)} bytes {offset}+{length}")
        if self.remote:
            count(len(data), get=True)
        return data

    def array(self, name: str) -> np.ndarray | NpyRows:
        """The ``.npy`` file ``name`` without reading its data: on a local root
        ``np.load(path, mmap_mode="r")`` (a read-only memory map); from a bucket an
        :class:`NpyRows` whose rows are fetched by range reads when indexed.

        Raises:
            FileNotFoundError: naming ``{uri}/{name}``.
            ValueError: not a ``.npy`` file, or an object / Fortran-order array (names the file).
        """
        local = self.local_path(name)
        if local is not None:
            if not local.is_file():
                raise self._missing(name)
            return np.load(local, mmap_mode="r", allow_pickle=False)
        return NpyRows(self, name)

    def close(self) -> None:
        """Close the files :meth:`read_range` kept open (the object stays usable)."""
        with self._handle_lock:
            handles, self._handles = list(self._handles.values()), {}
        for handle in handles:
            handle.close()


__all__ = ["NpyRows", "StepFiles", "bytes_fetched", "ranged_gets", "s3_filesystem"]  # counters: tidal/files/counting.py
