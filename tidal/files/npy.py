"""A ``.npy`` array in a bucket read by rows: the header once, then each run of rows one ranged GET.

numpy's format (magic ``\\x93NUMPY``, version, little-endian header length, a Python-literal dict,
then the C-order data) puts row ``i`` of a 2-D array at ``offset + i * row_bytes``, so a batch of rows
is a few byte ranges (numpy.lib.format docs). :meth:`tidal.files.step_files.StepFiles.array` hands these out for
bucket roots and plain memory maps for local ones.
"""

from __future__ import annotations

import ast
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

NPY_HEAD_BYTES = 512  # first range read of a .npy (np.save: 128 bytes of header for a 2-D array; longer: reread)
RANGE_READERS = 16  # concurrent range reads of one gather from a bucket

_lock = threading.Lock()
_pool: list[ThreadPoolExecutor] = []


def _range_pool() -> ThreadPoolExecutor:
    with _lock:
        if not _pool:
            _pool.append(ThreadPoolExecutor(max_workers=RANGE_READERS, thread_name_prefix="tidal-range"))
        return _pool[0]


def _npy_header(head: bytes, where: str) -> tuple[tuple[int, ...], np.dtype, bool, int, int]:
    """``(shape, dtype, fortran_order, data offset, header length)`` of a ``.npy`` prefix (numpy's
    format: magic ``\\x93NUMPY``, version, little-endian header length, a Python-literal dict)."""
    if head[:6] != b"\x93NUMPY" or len(head) < 10:
        raise ValueError(f"{where}: not a .npy file (no \\x93NUMPY magic)")
    major = head[6]
    if major == 1:
        start, length = 10, int.from_bytes(head[8:10], "little")
    elif major in (2, 3):
        start, length = 12, int.from_bytes(head[8:12], "little")
    else:
        raise ValueError(f"{where}: .npy format version {major} is not supported")
    if len(head) < start + length:
        return (), np.dtype(np.uint8), False, start + length, -1
    text = head[start:start + length].decode("utf-8" if major == 3 else "latin1")
    try:
        fields = ast.literal_eval(text)
        dtype = np.lib.format.descr_to_dtype(fields["descr"])
        shape, fortran = tuple(int(n) for n in fields["shape"]), bool(fields["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as err:
        raise ValueError(f"{where}: malformed .npy header {text!r} ({err})") from None
    return shape, dtype, fortran, start + length, length


class NpyRows:
    """Rows of a C-order ``.npy`` file in a bucket, fetched by range reads; indexes like a read-only
    array along axis 0 (``rows[i]``, ``rows[a:b]``, ``rows[int_array]``) and returns ``np.ndarray``.

    Row ``i`` is the bytes ``[offset + i * row_bytes, offset + (i + 1) * row_bytes)``; a gather
    fetches each run of consecutive requested rows with one ranged GET (runs concurrently), so it
    reads exactly the requested rows' bytes.

    Attributes:
        shape, dtype, ndim: of the stored array.
        offset: bytes before the data (the header).
        row_bytes: bytes per row (``itemsize * prod(shape[1:])``).
    """

    def __init__(self, files: Any, name: str):  # a tidal.files.step_files.StepFiles (read_range, uri_of)
        self.files, self.name = files, name
        where = files.uri_of(name)
        head = files.read_range(name, 0, NPY_HEAD_BYTES)
        shape, dtype, fortran, offset, length = _npy_header(head, where)
        if length < 0:
            head = files.read_range(name, 0, offset)
            shape, dtype, fortran, offset, length = _npy_header(head, where)
        if dtype.hasobject:
            raise ValueError(f"{where}: object arrays are not read (allow_pickle is off)")
        if fortran and len(shape) > 1:
            raise ValueError(f"{where}: Fortran-order array; rows are byte ranges only in C order")
        if not shape:
            raise ValueError(f"{where}: a 0-d array has no rows")
        self.shape, self.dtype, self.ndim, self.offset = shape, dtype, len(shape), offset
        self.row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"NpyRows({self.files.uri_of(self.name)!r}, shape={self.shape}, dtype={self.dtype})"

    def _read_rows(self, start: int, stop: int) -> bytes:
        n = (stop - start) * self.row_bytes
        data = self.files.read_range(self.name, self.offset + start * self.row_bytes, n)
        if len(data) != n:
            raise OSError(f"{self.files.uri_of(self.name)}: rows {start}..{stop} need {n} bytes, got {len(data)} "
                          "(file shorter than its header says)")
        return data

    def _rows(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((max(stop - start, 0), *self.shape[1:]), dtype=self.dtype)
        if stop > start:
            out.reshape(-1).view(np.uint8)[:] = np.frombuffer(self._read_rows(start, stop), dtype=np.uint8)
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        n = self.shape[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step == 1:
                return self._rows(start, max(start, stop))
            return self.take(np.arange(start, stop, step))
        if isinstance(key, (int, np.integer)):
            index = int(key) + n if key < 0 else int(key)
            if not 0 <= index < n:
                raise IndexError(f"{self.files.uri_of(self.name)}: row {key} is outside [0, {n})")
            return self._rows(index, index + 1)[0]
        return self.take(np.asarray(key))

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (1-D ints, any order, repeats allowed; negatives count from the end) as
        ``[len(rows), *shape[1:]]`` of the stored dtype.

        Raises:
            IndexError: a row outside ``[-n, n)``, naming the file.
        """
        rows = np.asarray(rows)
        if rows.dtype == bool or rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
            raise IndexError(f"{self.files.uri_of(self.name)}: rows must be a 1-D integer array, got "
                             f"{rows.dtype} of shape {rows.shape}")
        n = self.shape[0]
        rows = np.where(rows < 0, rows + n, rows).astype(np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"{self.files.uri_of(self.name)}: rows outside [0, {n})")
        out = np.empty((rows.size, *self.shape[1:]), dtype=self.dtype)
        if not rows.size:
            return out
        unique = np.unique(rows)
        breaks = np.nonzero(np.diff(unique) != 1)[0] + 1
        runs = [(int(run[0]), int(run[-1]) + 1) for run in np.split(unique, breaks)]
        if len(runs) == 1:
            parts = [self._rows(*runs[0])]
        else:
            parts = list(_range_pool().map(lambda run: self._rows(*run), runs))
        gathered = np.concatenate(parts, axis=0)  # the rows of ``unique``, in order
        out[:] = gathered[np.searchsorted(unique, rows)]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self._rows(0, self.shape[0])
        return whole if dtype is None else whole.astype(dtype)
