"""Token spills for the tokenize step: each input document shard encoded on its own.

Each input document shard (sorted by ``id``) is encoded by one worker (:func:`encode_shard`) into a
*spill*: ``<spill dir>/tokens-<k>.bin``, the shard's documents' token ids (``uint32``, each document
followed by its end-of-text id) back to back, and ``index-<k>.bin``, one fixed-size record per encoded
document (id, tokens; :data:`INDEX_DTYPE`) in the same order, so a worker can start reading either
file at any document by byte offset. The spill's summary also counts its documents and tokens per id
range (the first two hex digits of the id, :data:`RANGES` ranges): from these small vectors the token
shards' writers (:mod:`tidal.data.token_writers`) know where in each spill their rows begin.

Memory: one encode batch per worker, plus the ids and lengths of its own shard (about 100 bytes a
document).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles

ID_DTYPE = np.dtype(np.uint32)
# a spill's index: one record per document in id order (ids are 64 hex digits: no NUL byte for "S" to strip)
INDEX_DTYPE = np.dtype([("id", "S64"), ("tokens", "<u8")])
RANGES = 256  # id ranges (first two hex digits) a spill counts its documents and tokens in


def encode_shard(index: int, path: str, spill: OutputDir, encode_batches: Iterator[tuple[list, list]],
                 fallback_ids: Sequence[int], unk_id: int | None, dtype: np.dtype = ID_DTYPE) -> dict[str, Any]:
    """Write shard ``index``'s spill from its encoded batches.

    Args:
        index: the input shard's number (names the spill files).
        path: the input shard (for messages only).
        spill: where the spill files go (a local directory or a bucket prefix every worker reads).
        encode_batches: ``(encoded, failed)`` per batch in id order, as
            :func:`tidal.data.tokenize.encode_documents` returns them.
        fallback_ids, unk_id: as :func:`tidal.data.tokenize.special_token_ids`.
        dtype: the spill's token dtype (the output shards', :func:`tidal.data.shards.token_dtype`: a
            ``uint16`` spill is half the bytes to write and read back).

    Returns:
        ``{"index", "source" (``path``), "tokens" (spill path, ``dtype`` tokens), "ids" (index file path:
        :data:`INDEX_DTYPE` records), "dtype", "documents", "stream_tokens" (with end-of-text ids),
        "encoded_tokens" (without), "unknown_tokens", "byte_fallback_tokens", "failed": [(id, error)],
        "range_documents", "range_tokens" (documents and stream tokens per id range, :func:`id_range`,
        :data:`RANGES` each)}``.

    Raises:
        ValueError: a document id that does not start with two hex digits, or a token id that does not
            fit in ``dtype``.
    """
    tokens_name, index_name = f"tokens-{index:05d}.bin", f"index-{index:05d}.bin"
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
            if stream.size and int(stream.max()) > np.iinfo(dtype).max:
                raise ValueError(f"token id {int(stream.max())} does not fit in {np.dtype(dtype).name}")
            out.write(stream.astype(dtype, copy=False).tobytes())
            ids += [doc_id for doc_id, _ in encoded]
            lengths += sizes.tolist()
    records = np.empty(len(ids), dtype=INDEX_DTYPE)
    records["id"], records["tokens"] = ids, lengths
    ranges = np.array([id_range(doc_id, str(path)) for doc_id in ids], dtype=np.int64)
    range_documents = np.bincount(ranges, minlength=RANGES)
    range_tokens = np.zeros(RANGES, dtype=np.int64)
    np.add.at(range_tokens, ranges, np.asarray(lengths, dtype=np.int64))
    index_location = spill.write_bytes(index_name, records.tobytes())
    return {"index": index, "source": str(path), "tokens": spill.uri_of(tokens_name), "ids": index_location,
            "documents": len(ids), "stream_tokens": int(sum(lengths)), "failed": failed, "dtype": np.dtype(dtype).name,
            "range_documents": range_documents.tolist(), "range_tokens": range_tokens.tolist(), **counts}


def id_range(doc_id: str, source: str) -> int:
    """The id range of a document: its id's first two hex digits (0-255; ids are sha256 hex, so ranges
    are equally likely). Raises ValueError naming ``source`` for an id that does not start so."""
    try:
        return int(doc_id[:2], 16)
    except ValueError:
        raise ValueError(f"{source}: document id {doc_id!r} does not start with two hex digits") from None


def read_ids(spill: dict[str, Any]) -> list[str]:
    """The document ids a spill holds, in its (id) order."""
    files, name = StepFiles.of_file(spill["ids"])
    return [raw.decode() for raw in np.frombuffer(files.read_bytes(name, checked=False), dtype=INDEX_DTYPE)["id"]]
