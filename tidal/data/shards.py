"""Shard files shared by the data steps: document parquet shards in, token ``.npy`` shards out.

Invariant: a shard set is named ``{prefix}-{i:05d}-of-{n:05d}.{ext}`` and read back in
index order, so concatenating shards 0..n-1 gives the step's rows in their one defined
order. Document shards (written by the clean step) are each sorted by ``id``; readers merge
them into one global ``id`` order and refuse a shard that is not sorted, because every
downstream byte (token order, packing, mixture) depends on that order being the same on
every machine. Token shards are 2-D ``.npy`` arrays ``[n_sequences, seq_len]`` of
``uint16`` (vocab size < 65536, docs/contracts.md) or ``uint32``; ``np.save``
output is a pure function of dtype, shape and values, so equal arrays give equal bytes.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

DOCUMENTS_PREFIX = "documents"
TOKENS_PREFIX = "tokens"
META_NAME = "meta.json"
UINT16_MAX_VOCAB = (
    65535  # docs/contracts.md: uint16 if vocab < 65536 (ids 0..65534; 65535 kept free)
)


class TokenizerMismatch(ValueError):
    """Token data was made with a different tokenizer (hash) or sequence length than required."""


def shard_name(prefix: str, index: int, count: int, ext: str) -> str:
    """File name of shard ``index`` of ``count``: ``shard_name("tokens", 0, 2, "npy")`` ->
    ``"tokens-00000-of-00002.npy"``.

    Raises:
        ValueError: if ``index`` is not in ``[0, count)``.
    """
    if not 0 <= index < count:
        raise ValueError(f"shard index {index} is outside [0, {count})")
    return f"{prefix}-{index:05d}-of-{count:05d}.{ext}"


def list_shards(step_dir: str | Path, prefix: str, ext: str) -> list[Path]:
    """The complete shard set ``{prefix}-*-of-*.{ext}`` under ``step_dir``, in index order.

    Raises:
        FileNotFoundError: if there is no shard, or the set is incomplete / mixes counts
            (e.g. ``-of-00002`` next to ``-of-00003``), naming the directory.
    """
    step_dir = Path(step_dir)
    paths = sorted(step_dir.glob(f"{prefix}-*-of-*.{ext}"))
    if not paths:
        raise FileNotFoundError(f"{step_dir}: no {prefix}-*-of-*.{ext} shards")
    count = int(paths[0].name.rsplit("-of-", 1)[1].split(".", 1)[0])
    expected = [step_dir / shard_name(prefix, i, count, ext) for i in range(count)]
    if paths != expected:
        names = [p.name for p in paths]
        raise FileNotFoundError(
            f"{step_dir}: incomplete or mixed shard set {names}; expected {count} shards"
        )
    return paths


def iter_shard_rows(
    path: str | Path, columns: Sequence[str] = ("id", "text"), batch_rows: int = 1024
) -> Iterator[list[tuple[Any, ...]]]:
    """Rows of one document parquet shard as lists of up to ``batch_rows`` tuples (``columns``
    order), checking that ``id`` is strictly increasing (the clean step's contract).

    Raises:
        KeyError: if a column is missing, naming the file and its columns.
        ValueError: if the shard is not sorted by ``id``, naming the file and row number.
    """
    path = Path(path)
    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    missing = [c for c in ("id", *columns) if c not in names]
    if missing:
        raise KeyError(f"{path}: missing columns {missing}; it has {names}")
    wanted = list(dict.fromkeys(["id", *columns]))
    previous, row = None, 0
    for record_batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted):
        data = record_batch.to_pydict()
        ids = data["id"]
        for doc_id in ids:
            if previous is not None and not previous < doc_id:
                raise ValueError(
                    f"{path}: row {row} id {doc_id!r} is not greater than the previous id "
                    f"{previous!r}; document shards must be sorted by id with no repeats"
                )
            previous, row = doc_id, row + 1
        yield list(zip(*(data[c] for c in columns)))


def iter_documents(
    step_dir: str | Path, columns: Sequence[str] = ("id", "text")
) -> Iterator[tuple[Any, ...]]:
    """Every document of a clean step's ``documents-*.parquet`` shards as tuples of
    ``columns`` in global ascending ``id`` order (a k-way merge of the sorted shards; memory
    is one batch per shard). ``"id"`` must be among ``columns``.

    Raises:
        FileNotFoundError / KeyError / ValueError: as :func:`list_shards` and
            :func:`iter_shard_rows` (missing shards, missing columns, unsorted shard).
    """
    if "id" not in columns:
        raise ValueError(f"columns {list(columns)} must include 'id' to define the order")
    key_index = list(columns).index("id")
    streams = [
        (row for batch in iter_shard_rows(path, columns) for row in batch)
        for path in list_shards(step_dir, DOCUMENTS_PREFIX, "parquet")
    ]
    return heapq.merge(*streams, key=lambda row: row[key_index])


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` if ``vocab_size`` <= 65535 (docs/contracts.md), else ``uint32``.

    Raises:
        ValueError: for a vocab size < 1 or >= 2**32.
    """
    if not 1 <= vocab_size < (1 << 32):
        raise ValueError(f"vocab_size {vocab_size} is outside [1, 2**32)")
    return np.dtype(np.uint16) if vocab_size <= UINT16_MAX_VOCAB else np.dtype(np.uint32)


def write_token_shards(
    out_dir: str | Path, sequences: np.ndarray, shards: int, prefix: str = TOKENS_PREFIX
) -> list[str]:
    """Write ``sequences`` (``[n_sequences, seq_len]``, any dtype, saved as given) into
    ``shards`` ``.npy`` files, assigning rows contiguously (``np.array_split``: the first
    ``n % shards`` shards get one row more; a shard may hold zero rows).

    Returns:
        The file names written, in shard order.

    Raises:
        ValueError: if ``sequences`` is not 2-D or ``shards`` < 1.
    """
    if sequences.ndim != 2:
        raise ValueError(
            f"sequences must be 2-D [n_sequences, seq_len], got shape {sequences.shape}"
        )
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    names = []
    for index, part in enumerate(np.array_split(sequences, shards, axis=0)):
        name = shard_name(prefix, index, shards, "npy")
        np.save(Path(out_dir) / name, np.ascontiguousarray(part), allow_pickle=False)
        names.append(name)
    return names


def read_json(path: str | Path) -> dict[str, Any]:
    """Parse a JSON file.

    Raises:
        FileNotFoundError: naming the file; ValueError: for malformed JSON, naming the file.
    """
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err}") from None


def read_token_meta(step_dir: str | Path) -> dict[str, Any]:
    """The ``meta.json`` of a tokenize or mix step (mix: ``mixture.json``), whichever exists."""
    step_dir = Path(step_dir)
    for name in (META_NAME, "mixture.json"):
        if (step_dir / name).is_file():
            return read_json(step_dir / name)
    raise FileNotFoundError(f"{step_dir}: neither {META_NAME} nor mixture.json")


def load_token_sequences(
    step_dir: str | Path, tokenizer_hash: str | None = None, seq_len: int | None = None
) -> np.ndarray:
    """All sequences of a tokenize or mix step, shards concatenated in order:
    ``[n_sequences, seq_len]`` of the stored dtype.

    Args:
        tokenizer_hash: if given, refuse data made with another tokenizer.
        seq_len: if given, refuse data packed to another sequence length (tokens).

    Raises:
        TokenizerMismatch: naming the directory and both hashes / lengths.
        ValueError: if a shard's dtype or width disagrees with the metadata.
    """
    step_dir = Path(step_dir)
    meta = read_token_meta(step_dir)
    if tokenizer_hash is not None and meta["tokenizer_hash"] != tokenizer_hash:
        raise TokenizerMismatch(
            f"{step_dir}: tokens were made with tokenizer {meta['tokenizer_hash']}, "
            f"but {tokenizer_hash} is required; re-tokenize with the model's tokenizer"
        )
    if seq_len is not None and meta["seq_len"] != seq_len:
        raise TokenizerMismatch(
            f"{step_dir}: seq_len is {meta['seq_len']}, but {seq_len} is required"
        )
    parts = [
        np.load(path, mmap_mode="r", allow_pickle=False)
        for path in list_shards(step_dir, TOKENS_PREFIX, "npy")
    ]
    for path, part in zip(list_shards(step_dir, TOKENS_PREFIX, "npy"), parts):
        if part.ndim != 2 or part.shape[1] != meta["seq_len"] or str(part.dtype) != meta["dtype"]:
            raise ValueError(
                f"{path}: shape {part.shape} dtype {part.dtype} disagrees with metadata "
                f"seq_len {meta['seq_len']} dtype {meta['dtype']}"
            )
    return np.concatenate(parts, axis=0) if parts else np.zeros((0, meta["seq_len"]), meta["dtype"])
