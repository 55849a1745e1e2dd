"""What this process read from buckets through :class:`tidal.files.step_files.StepFiles`: bytes and ranged GETs
(:func:`bytes_fetched`, :func:`ranged_gets`; benches and tests take differences around their work), and the
file-like reader that counts a remote file's reads and keeps its parquet tail (:class:`CountingReader`).
"""

from __future__ import annotations

import threading

import pyarrow as pa

from tidal.files.retry import with_retries

TAIL_CACHE_BYTES = 1 << 20  # a parquet file's tail read (footer) kept for reads inside it

_lock = threading.Lock()
_fetched = [0]
_ranged_gets = [0]


def bytes_fetched() -> int:
    """Bytes read from a bucket through :class:`StepFiles` in this process so far (every byte a
    read returned: whole files, ranges, parquet footers and column chunks); local reads count 0.
    Take a difference around the work to measure it."""
    return _fetched[0]


def ranged_gets() -> int:
    """Ranged reads (:meth:`StepFiles.read_range`, one GET each) from a bucket in this process so far;
    take a difference around the work (the trainer's GETs per step, bench/train_schedule.py)."""
    return _ranged_gets[0]


def count(n: int, *, get: bool = False) -> None:
    """Count ``n`` bytes read from a bucket (and one ranged GET with ``get``)."""
    with _lock:
        _fetched[0] += n
        _ranged_gets[0] += get


class CountingReader:
    """A file-like view of a pyarrow file from a bucket that counts the bytes it fetches.

    Parquet readers first read the file's last 64 KiB (the footer, speculatively) and then the
    column chunks; for a file that small the chunks lie inside that tail, so the tail read is kept
    (up to :data:`TAIL_CACHE_BYTES`) and later reads inside it are served from memory, not fetched
    again.
    """

    def __init__(self, raw: pa.NativeFile, name: str = ""):
        self._raw, self.name = raw, name
        self._size = raw.size()
        self._tail: tuple[int, bytes] | None = None
        self.closed = False

    def _cached(self, nbytes: int | None) -> bytes | None:
        if self._tail is None:
            return None
        position = self._raw.tell()
        end = self._size if nbytes is None or nbytes < 0 else min(position + nbytes, self._size)
        start, data = self._tail
        if start <= position and end <= start + len(data):
            self._raw.seek(end)
            return data[position - start:end - start]
        return None

    def _fetch(self, nbytes: int | None) -> bytes:
        position = self._raw.tell()

        def attempt() -> bytes:
            self._raw.seek(position)
            return self._raw.read(None if nbytes is None or nbytes < 0 else nbytes)

        data = with_retries(attempt, what=f"{self.name} bytes {position}+{nbytes}")
        count(len(data))
        if position + len(data) == self._size and len(data) <= TAIL_CACHE_BYTES:
            self._tail = (position, data)
        return data

    def read(self, nbytes: int | None = -1) -> bytes:
        cached = self._cached(nbytes)
        return cached if cached is not None else self._fetch(nbytes)

    def read_buffer(self, nbytes: int | None = None) -> pa.Buffer:
        return pa.py_buffer(self.read(nbytes))

    def seek(self, position: int, whence: int = 0) -> int:
        return self._raw.seek(position, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def size(self) -> int:
        return self._raw.size()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._raw.close()


__all__ = ["TAIL_CACHE_BYTES", "CountingReader", "bytes_fetched", "count", "ranged_gets"]
