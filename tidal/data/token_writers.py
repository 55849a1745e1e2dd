"""Token shards written in parallel: each output shard by the worker that owns it, from the token spills.

The token stream is every encoded document in ascending id order, each followed by its end-of-text id,
cut into ``seq_len`` rows; output shard ``k`` holds the rows :func:`numpy.array_split` gives it, so its
content is a pure function of the input. Which tokens those are is known from small records only:

1. :func:`plan_writes` (one element: the spills' summaries, :data:`tidal.data.token_spill.RANGES` counts
   each, never a document): the stream's length, each shard's rows and first token, the stream position
   at which each id range starts (the ranges' token counts summed in range order), and for each shard
   where its range begins in every spill (the spill's own counts before that range).
2. :func:`write_shard` (one element per output shard, any worker): merges the spills' documents by id
   from the start of the range holding the shard's first token, reading each spill's index and tokens
   by byte range from there (:meth:`tidal.files.step_files.StepFiles.read_range`), skips the tokens
   before its first row, writes its rows, and stops at its last token. The worker of the last shard goes
   on to the end of the spills (the dropped tail, shorter than one row), so every document is merged
   by some worker and two spills holding the same id are refused: the two copies share a range, and
   a worker starts at a range's first document.

A worker reads its own rows' tokens plus at most the index records of one id range before them; no
worker holds more than a read buffer per spill and one chunk of rows.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tidal.data.token_spill import ID_DTYPE, INDEX_DTYPE, RANGES
from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles

CHUNK_ROWS = 4096  # output rows written per write call
INDEX_CHUNK = 16_384  # index records fetched per ranged read (1.1 MiB)
READ_AHEAD = 4 << 20  # bytes of a spill's tokens fetched per ranged read


def shard_rows(n_sequences: int, shards: int) -> list[int]:
    """Rows of each of ``shards`` output shards, as :func:`numpy.array_split` splits ``n_sequences``."""
    return [n_sequences // shards + (1 if k < n_sequences % shards else 0) for k in range(shards)]


def plan_writes(spills: Sequence[dict[str, Any]], names: Sequence[str], seq_len: int) -> list[dict[str, Any]]:
    """One task per output shard ``names[k]`` from the spills' summaries (module docstring, step 1).

    Returns:
        ``[{"name", "rows", "first_token", "last" (the last shard: goes on to the spills' end),
        "position" (stream position of the range it starts at), "spills": [{"index", "source",
        "tokens", "ids", "document" (the first document of that range in the spill), "token"
        (that document's first token in the spill), "read_documents", "read_tokens" (how many of each it reads
        from there: up to the end of the range holding its last token; each read is at most that
        large)}]}]``; positions and tokens count ``uint32`` tokens.

    Raises:
        ValueError: if ``seq_len`` < 1.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    spills = sorted(spills, key=lambda s: s["index"])
    n_sequences = sum(s["stream_tokens"] for s in spills) // seq_len
    documents = np.array([s["range_documents"] for s in spills], dtype=np.int64).reshape(len(spills), RANGES)
    tokens = np.array([s["range_tokens"] for s in spills], dtype=np.int64).reshape(len(spills), RANGES)
    range_start = np.concatenate([[0], np.cumsum(tokens.sum(axis=0))])  # stream position of each range
    doc_before = np.concatenate([np.zeros((len(spills), 1), np.int64), np.cumsum(documents, axis=1)], axis=1)
    tok_before = np.concatenate([np.zeros((len(spills), 1), np.int64), np.cumsum(tokens, axis=1)], axis=1)
    tasks, first_row = [], 0
    for k, rows in enumerate(shard_rows(n_sequences, len(names))):
        first_token, last = first_row * seq_len, k == len(names) - 1
        start = int(np.searchsorted(range_start[:RANGES], first_token, side="right")) - 1  # range holding it
        # the range holding its last token (the last shard: the last range, for the tail)
        stop = RANGES - 1 if last else int(np.searchsorted(range_start[:RANGES], first_token + rows * seq_len - 1,
                                                           side="right")) - 1
        stop = max(stop, start) if rows or last else start - 1  # a shard of no rows reads nothing
        tasks.append({
            "name": names[k], "rows": rows, "first_token": first_token, "last": last,
            "position": int(range_start[start]),
            "spills": [{"index": s["index"], "source": s["source"], "tokens": s["tokens"], "ids": s["ids"],
                        "dtype": s.get("dtype", ID_DTYPE.name),
                        "document": int(doc_before[i, start]), "token": int(tok_before[i, start]),
                        "read_documents": int(doc_before[i, stop + 1] - doc_before[i, start]),
                        "read_tokens": int(tok_before[i, stop + 1] - tok_before[i, start])}
                       for i, s in enumerate(spills)]})
        first_row += rows
    return tasks


class _Ranges:
    """Sequential reads of one spill file by byte range from an offset, a block at a time."""

    def __init__(self, location: str, offset: int, block: int):
        self.files, self.name = StepFiles.of_file(location)
        self.offset, self.block = offset, block
        self.buffer, self.start = b"", offset

    def read(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the end of the file)."""
        end = self.offset + n
        if end > self.start + len(self.buffer):
            keep = self.buffer[self.offset - self.start:]
            more = self.files.read_range(self.name, self.start + len(self.buffer), max(self.block, n - len(keep)))
            self.buffer, self.start = keep + more, self.offset
        data = self.buffer[self.offset - self.start:end - self.start]
        self.offset += len(data)
        return data

    def skip(self, n: int) -> None:
        self.offset += n
        if self.offset > self.start + len(self.buffer):
            self.buffer, self.start = b"", self.offset

    def close(self) -> None:
        self.files.close()


def _documents(spill: dict[str, Any]) -> Iterator[tuple[bytes, int, int]]:
    """``(id, spill index, tokens)`` of the task's ``read_documents`` documents of a spill from its
    ``document`` on, in id order."""
    if not spill["read_documents"]:
        return
    chunk = min(INDEX_CHUNK, spill["read_documents"]) * INDEX_DTYPE.itemsize
    reader = _Ranges(spill["ids"], spill["document"] * INDEX_DTYPE.itemsize, chunk)
    left = spill["read_documents"]
    try:
        while left:
            data = reader.read(min(INDEX_CHUNK, left) * INDEX_DTYPE.itemsize)
            if not data:
                return
            left -= len(data) // INDEX_DTYPE.itemsize
            records = np.frombuffer(data, dtype=INDEX_DTYPE)
            for doc_id, length in zip(records["id"].tolist(), records["tokens"].tolist(), strict=True):
                yield doc_id, spill["index"], length
    finally:
        reader.close()


def write_shard(task: dict[str, Any], out: OutputDir, seq_len: int, dtype: np.dtype) -> dict[str, Any]:
    """Write one output shard ``task["name"]`` (a :func:`plan_writes` task) into ``out``: a ``.npy`` of
    ``[task["rows"], seq_len]`` ``dtype``, byte for byte what :func:`numpy.save` writes for those rows.

    Returns:
        ``{"name", "rows"}``.

    Raises:
        ValueError: a document id in two spills (naming both input shards), a token id that does not fit
            in ``dtype``, or spills that end before the shard's rows do.
    """
    dtype = np.dtype(dtype)
    limit = np.iinfo(dtype).max
    first, end = task["first_token"], task["first_token"] + task["rows"] * seq_len
    sources = {s["index"]: s["source"] for s in task["spills"]}
    position, previous, pending, pending_tokens, written = task["position"], None, [], 0, 0
    with contextlib.ExitStack() as stack, out.file(task["name"]) as path, path.open("wb") as f:
        readers, types = {}, {}
        for s in task["spills"]:
            types[s["index"]] = spill_type = np.dtype(s["dtype"])
            block = max(1, min(READ_AHEAD // spill_type.itemsize, s["read_tokens"])) * spill_type.itemsize
            readers[s["index"]] = _Ranges(s["tokens"], s["token"] * spill_type.itemsize, block)
            stack.callback(readers[s["index"]].close)
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                 "fortran_order": False, "shape": (task["rows"], seq_len)})
        for doc_id, index, length in heapq.merge(*(_documents(s) for s in task["spills"])):
            if previous is not None and doc_id == previous[0]:
                raise ValueError(f"document id {doc_id.decode()} appears in two document shards, "
                                 f"{sources[previous[1]]} and {sources[index]}")
            previous = (doc_id, index)
            if position >= end and not task["last"]:
                break
            lo, hi = max(first, position), min(end, position + length)
            size = types[index].itemsize
            if hi <= lo:
                readers[index].skip(length * size)
            else:
                readers[index].skip((lo - position) * size)
                pending.append(np.frombuffer(readers[index].read((hi - lo) * size), dtype=types[index]))
                readers[index].skip((position + length - hi) * size)
                pending_tokens += hi - lo
                if pending_tokens >= CHUNK_ROWS * seq_len or hi == end:
                    rows, pending = _write_rows(f, pending, seq_len, dtype, limit)
                    written, pending_tokens = written + rows, sum(p.size for p in pending)
            position += length
        if written != task["rows"]:
            raise ValueError(f"{task['name']}: the spills end after {written} of its {task['rows']} rows")
    return {"name": task["name"], "rows": written}


def _write_rows(f, pending: list[np.ndarray], seq_len: int, dtype: np.dtype,
                limit: int) -> tuple[int, list[np.ndarray]]:
    """Write the whole rows of ``pending``; returns how many, and the rest (part of the next row)."""
    stream = np.concatenate(pending)
    rows = stream.size // seq_len
    body = stream[: rows * seq_len]
    if body.size and int(body.max()) > limit:
        raise ValueError(f"token id {int(body.max())} does not fit in {dtype.name}")
    f.write(body.astype(dtype).tobytes())
    rest = stream[rows * seq_len:]
    return rows, ([rest] if rest.size else [])


def merge_spills(spills: Sequence[dict[str, Any]], out: OutputDir, names: list[str], seq_len: int,
                 dtype: np.dtype) -> dict[str, int]:
    """Every shard of :func:`plan_writes`, written here one after another by :func:`write_shard` (what
    the workers of a job do in parallel; for tests and small tools).

    Returns:
        ``{"n_sequences", "tokens_dropped_tail", "n_documents"}``.
    """
    rows = sum(write_shard(task, out, seq_len, dtype)["rows"] for task in plan_writes(spills, names, seq_len))
    total = sum(s["stream_tokens"] for s in spills)
    return {"n_sequences": rows, "tokens_dropped_tail": total - rows * seq_len,
            "n_documents": sum(s["documents"] for s in spills)}
