"""Streaming pack for the tokenize step: per-shard token spills, then a k-way merge by id.

Each input document shard (sorted by ``id``) is encoded on its own by
:func:`encode_shard` into a *spill*: ``<spill dir>/tokens-<k>.bin``, the shard's documents'
token ids (``uint32``, each document followed by its end-of-text id) back to back, plus
``ids-<k>.json`` (the encoded documents' ids and token counts in file order). The final
stage (:func:`merge_spills`) walks the documents of every spill in global ascending ``id``
order (``heapq.merge``; each spill is read sequentially, so a shard's tokens are read once
and in order), cuts the stream into ``seq_len`` rows and writes the output ``.npy`` shards
as it goes, byte for byte what :func:`numpy.save` writes for the whole array split with
``np.array_split`` (the number of rows is known from the spills before writing starts).

Memory: one encode batch per worker in the first stage; in the merge, the ids and lengths
of every document (about 100 bytes a document) plus one read buffer per spill and one
output chunk (:data:`CHUNK_ROWS` rows), whatever the corpus size.
"""

from __future__ import annotations

import contextlib
import heapq
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles

ID_DTYPE = np.dtype(np.uint32)
CHUNK_ROWS = 4096  # output rows written per write call


def encode_shard(index: int, path: str, spill: OutputDir, encode_batches: Iterator[tuple[list, list]],
                 fallback_ids: Sequence[int], unk_id: int | None) -> dict[str, Any]:
    """Write shard ``index``'s spill from its encoded batches.

    Args:
        index: the input shard's number (names the spill files).
        path: the input shard (for messages only).
        spill: where the spill files go (a local directory or a bucket prefix every worker reads).
        encode_batches: ``(encoded, failed)`` per batch in id order, as
            :func:`tidal.data.tokenize.encode_documents` returns them.
        fallback_ids, unk_id: as :func:`tidal.data.tokenize.special_token_ids`.

    Returns:
        ``{"index", "source" (``path``), "tokens" (spill path), "ids" (ids file path), "documents",
        "stream_tokens" (with end-of-text ids), "encoded_tokens" (without), "unknown_tokens",
        "byte_fallback_tokens", "failed": [(id, error)]}``.
    """
    tokens_name, ids_name = f"tokens-{index:05d}.bin", f"ids-{index:05d}.json"
    fallback = np.asarray(sorted(fallback_ids), dtype=ID_DTYPE)
    ids: list[str] = []
    lengths: list[int] = []
    failed: list[tuple[str, str]] = []
    counts = {"encoded_tokens": 0, "unknown_tokens": 0, "byte_fallback_tokens": 0}
    with spill.file(tokens_name) as tokens_path, tokens_path.open("wb") as out:
        for encoded, batch_failed in encode_batches:
            failed += batch_failed
            if not encoded:
                continue
            stream = np.concatenate([array for _, array in encoded]).astype(ID_DTYPE, copy=False)
            sizes = np.fromiter((array.size for _, array in encoded), dtype=np.int64, count=len(encoded))
            body = np.ones(stream.size, dtype=bool)
            body[np.cumsum(sizes) - 1] = False  # each document's last token is its end-of-text id
            counts["encoded_tokens"] += int(body.sum())
            if fallback.size:
                counts["byte_fallback_tokens"] += int((np.isin(stream, fallback) & body).sum())
            if unk_id is not None:
                counts["unknown_tokens"] += int(((stream == unk_id) & body).sum())
            out.write(stream.tobytes())
            ids += [doc_id for doc_id, _ in encoded]
            lengths += sizes.tolist()
    ids_location = spill.write_text(ids_name, json.dumps({"source": str(path), "ids": ids, "lengths": lengths}))
    return {"index": index, "source": str(path), "tokens": spill.uri_of(tokens_name), "ids": ids_location,
            "documents": len(ids), "stream_tokens": int(sum(lengths)), "failed": failed, **counts}


class _NpyShardWriter:
    """Writes ``[rows, seq_len]`` arrays as consecutive ``.npy`` files ``names`` of ``out``, of
    fixed row counts; a file is installed when its last row is written (:meth:`OutputDir.file`)."""

    def __init__(self, out: OutputDir, names: list[str], rows: list[int], seq_len: int, dtype: np.dtype):
        self.out, self.names, self.rows, self.seq_len, self.dtype = out, names, rows, seq_len, dtype
        self.index, self.left, self.file = -1, 0, None
        self.installing: contextlib.AbstractContextManager | None = None
        self._next()

    def _next(self) -> None:
        while True:
            self.close()
            self.index += 1
            if self.index >= len(self.names):
                return
            self.installing = self.out.file(self.names[self.index])
            self.file = self.installing.__enter__().open("wb")
            header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                      "shape": (self.rows[self.index], self.seq_len)}
            np.lib.format.write_array_header_1_0(self.file, header)
            self.left = self.rows[self.index]
            if self.left:
                return

    def write(self, block: np.ndarray) -> None:
        while block.shape[0]:
            take = min(self.left, block.shape[0])
            self.file.write(block[:take].tobytes())
            block, self.left = block[take:], self.left - take
            if not self.left:
                self._next()

    def close(self) -> None:
        """Install the file being written (complete or not: :func:`merge_spills` fails if rows are missing)."""
        if self.file is not None:
            self.file.close()
            self.file = None
            installing, self.installing = self.installing, None
            installing.__exit__(None, None, None)

    def abort(self) -> None:
        """Drop the file being written (after an error): nothing partial is installed."""
        if self.file is not None:
            self.file.close()
            self.file = None
            installing, self.installing = self.installing, None
            installing.__exit__(RuntimeError, RuntimeError("aborted"), None)


def _open_stream(location: str) -> Any:
    files, name = StepFiles.of_file(location)
    return files.open_stream(name)


def _doc_stream(spill: dict[str, Any]) -> Iterator[tuple[str, int, int]]:
    files, name = StepFiles.of_file(spill["ids"])
    meta = json.loads(files.read_bytes(name, checked=False))
    for doc_id, length in zip(meta["ids"], meta["lengths"], strict=True):
        yield doc_id, spill["index"], length


def merge_spills(spills: Sequence[dict[str, Any]], out: OutputDir, names: list[str], seq_len: int,
                 dtype: np.dtype) -> dict[str, int]:
    """Merge spills in ascending id order into ``len(names)`` ``.npy`` shards ``names`` of ``out``
    of ``[rows, seq_len]`` ``dtype`` (rows split as ``np.array_split`` does). Spill files are read
    sequentially, from a local directory or a bucket (buffered streams).

    Returns:
        ``{"n_sequences", "tokens_dropped_tail", "n_documents"}``.

    Raises:
        ValueError: if ``seq_len`` < 1, two spills hold the same id, or a token id does not
            fit in ``dtype``.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    total = sum(s["stream_tokens"] for s in spills)
    n_sequences = total // seq_len
    shards = len(names)
    rows = [n_sequences // shards + (1 if k < n_sequences % shards else 0) for k in range(shards)]
    limit = np.iinfo(dtype).max
    pending: list[np.ndarray] = []
    pending_tokens = written_rows = documents = 0
    previous = previous_index = None
    sources = {s["index"]: s["source"] for s in spills}
    chunk_tokens = CHUNK_ROWS * seq_len
    writer = _NpyShardWriter(out, names, rows, seq_len, np.dtype(dtype))
    with contextlib.ExitStack() as stack:
        stack.push(lambda kind, *_: writer.abort() if kind else writer.close())
        readers = {s["index"]: stack.enter_context(_open_stream(s["tokens"])) for s in spills}
        for doc_id, index, length in heapq.merge(*(_doc_stream(s) for s in spills)):
            if previous is not None and doc_id == previous:
                raise ValueError(f"document id {doc_id} appears in two document shards, "
                                 f"{sources[previous_index]} and {sources[index]}")
            previous, previous_index = doc_id, index
            documents += 1
            pending.append(np.frombuffer(readers[index].read(length * ID_DTYPE.itemsize), dtype=ID_DTYPE))
            pending_tokens += length
            if pending_tokens >= chunk_tokens:
                written_rows, pending, pending_tokens = _flush(writer, pending, seq_len, limit, dtype,
                                                               written_rows, n_sequences)
        written_rows, pending, pending_tokens = _flush(writer, pending, seq_len, limit, dtype, written_rows,
                                                       n_sequences)
    return {"n_sequences": n_sequences, "tokens_dropped_tail": total - n_sequences * seq_len, "n_documents": documents}


def _flush(writer: _NpyShardWriter, pending: list[np.ndarray], seq_len: int, limit: int, dtype: np.dtype,
           written_rows: int, n_sequences: int) -> tuple[int, list[np.ndarray], int]:
    """Write the whole rows of ``pending``; keep the remainder (the tail is never written)."""
    stream = np.concatenate(pending) if pending else np.zeros(0, ID_DTYPE)
    if stream.size and int(stream.max()) > limit:
        raise ValueError(f"token id {int(stream.max())} does not fit in {np.dtype(dtype).name}")
    rows = min(stream.size // seq_len, n_sequences - written_rows)
    if rows:
        writer.write(stream[: rows * seq_len].astype(dtype).reshape(rows, seq_len))
    rest = stream[rows * seq_len :]
    return written_rows + rows, ([rest] if rest.size else []), int(rest.size)
