"""Where a job's workers write: a local directory, or a prefix in the bucket every machine reads.

Invariant (docs/architecture.md section 0): a Beam worker on another machine writes each file it makes to
the location it was handed, never to a disk another process must read. Each file is written whole
or not at all: on a local root under a temporary name of this attempt, then renamed into place; in
a bucket by one upload that the store makes visible only when complete (a PUT, or a multipart
upload on close), so a reader never sees part of a file and a retried bundle, which writes the
same name with the same bytes, replaces it harmlessly. Two attempts of a step write under
different locations (:func:`tidal.storage.staging.new_staging`), so they never see each other's files.

In a bucket a file is first made on the writing process's own scratch disk (a library such as
Parquet's writer wants a path) and uploaded by the same process before the bundle completes.
With ``checksums`` set, the size and sha256 of each file, computed while uploading it, are recorded
at ``{checksums}/{name}.json``: the launcher builds the step's manifest from the listing and these
records (:func:`tidal.storage.staging.seal_staged`) without reading the bytes again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tidal.files.step_files import COPY_CHUNK_BYTES, StepFiles, is_uri
from tidal.storage.layout import temporary_name

CHECKSUM_SUFFIX = ".json"


class OutputDir:
    """A writable location: a local directory or a bucket prefix. Picklable (Beam ships it to workers).

    Attributes:
        location: as given, without a trailing ``/`` (a path or ``s3://bucket/prefix``).
        checksums: where per-file ``{"bytes", "sha256"}`` records go (bucket locations only), or None.
    """

    def __init__(self, location: str | Path, checksums: str | None = None):
        self.location = str(location).rstrip("/") or "/"
        self.remote = is_uri(self.location)
        self.checksums = checksums.rstrip("/") if checksums and self.remote else None

    def __repr__(self) -> str:
        return f"OutputDir({self.location!r})"

    def __reduce__(self):
        return OutputDir, (self.location, self.checksums)

    def uri_of(self, name: str) -> str:
        """Where file ``name`` lands: ``{location}/{name}`` (a path on a local root)."""
        return f"{self.location}/{name}"

    def child(self, name: str) -> OutputDir:
        """The sub-location ``{location}/{name}`` (no checksums: scratch such as spill files)."""
        return OutputDir(self.uri_of(name))

    @contextlib.contextmanager
    def file(self, name: str) -> Iterator[Path]:
        """A local path to write ``name`` to; installed at :meth:`uri_of` when the block ends
        without an exception (renamed locally, uploaded to a bucket), dropped otherwise.

        Raises:
            OSError: the upload failed (pyarrow's error, naming the object).
        """
        if not self.remote:
            target = Path(self.uri_of(name))
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = temporary_name(target)
            try:
                yield tmp
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            return
        scratch = Path(tempfile.mkdtemp(prefix="tidal-out."))
        try:
            local = scratch / Path(name).name
            yield local
            self._upload(name, local)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def write_bytes(self, name: str, data: bytes) -> str:
        """Write ``data`` as file ``name`` (whole or not at all). Returns :meth:`uri_of`."""
        with self.file(name) as path:
            path.write_bytes(data)
        return self.uri_of(name)

    def write_text(self, name: str, text: str) -> str:
        """Write ``text`` (UTF-8) as file ``name``. Returns :meth:`uri_of`."""
        return self.write_bytes(name, text.encode("utf-8"))

    def _upload(self, name: str, local: Path) -> None:
        files = StepFiles.open(self.location)
        digest, size = hashlib.sha256(), 0
        with open(local, "rb") as source, files._fs.open_output_stream(files._path(name), metadata={}) as out:
            while chunk := source.read(COPY_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if self.checksums:
            record = json.dumps({"bytes": size, "sha256": digest.hexdigest()}).encode()
            marks = StepFiles.open(self.checksums)
            with marks._fs.open_output_stream(marks._path(name + CHECKSUM_SUFFIX), metadata={}) as out:
                out.write(record)

    def remove(self) -> None:
        """Delete a local location and everything under it (a missing one is fine): spill files after
        use. A bucket prefix is left to the launcher, which deletes it with the storage layer
        (:func:`tidal.storage.uris.delete_dir`): pyarrow's S3 deletes leave directory markers behind."""
        if not self.remote:
            shutil.rmtree(self.location, ignore_errors=True)


def read_checksums(location: str) -> dict[str, dict[str, int | str]]:
    """The ``{name: {"bytes", "sha256"}}`` records :class:`OutputDir` wrote under ``location``."""
    files = StepFiles.open(location)
    records = {}
    for name in files.names(f"*{CHECKSUM_SUFFIX}"):
        records[name[: -len(CHECKSUM_SUFFIX)]] = json.loads(files.read_bytes(name, checked=False))
    return records


__all__ = ["CHECKSUM_SUFFIX", "OutputDir", "read_checksums"]
