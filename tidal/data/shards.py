"""Shard files shared by the data steps: document parquet shards in, token ``.npy`` shards out.

Invariant: a shard set is named ``{prefix}-{i:05d}-of-{n:05d}.{ext}`` and read back in
index order, so concatenating shards 0..n-1 gives the step's rows in their one defined
order. Document shards (written by the clean step) are each sorted by ``id``; readers merge
them into one global ``id`` order and refuse a shard that is not sorted, because every
downstream byte (token order, packing, mixture) depends on that order being the same on
every machine. Token shards are 2-D ``.npy`` arrays ``[n_sequences, seq_len]`` of
``uint16`` (vocab size < 65536, docs/contracts.md) or ``uint32``; ``np.save``
output is a pure function of dtype, shape and values, so equal arrays give equal bytes.

Readers take a step as a :class:`tidal.files.step_files.StepFiles` (or a directory / bucket URI, opened as
one) and read in place: parquet shards by the columns asked for, token shards by the rows asked
for (memory maps on a local root, range reads from a bucket).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidal.files.step_files import StepFiles

DOCUMENTS_PREFIX = "documents"
TOKENS_PREFIX = "tokens"
META_NAME = "meta.json"
# The clean step's document shards (tidal/data/clean/step.py); ``fields``: the record's own id and kept
# fields as JSON (tidal/data/record_fields.py), or null. The decontaminate step writes the same.
DOCUMENT_SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("source", pa.string()),
                             ("ref", pa.string()), ("language", pa.string()), ("fields", pa.string())])
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


def shard_names(step: StepFiles | str | Path, prefix: str, ext: str) -> list[str]:
    """File names of the complete shard set ``{prefix}-*-of-*.{ext}`` of ``step``, in index order
    (one listing of the step).

    Raises:
        FileNotFoundError: if there is no shard, or the set is incomplete / mixes counts
            (e.g. ``-of-00002`` next to ``-of-00003``), naming the step.
    """
    files = StepFiles.open(step)
    names = files.names(f"{prefix}-*-of-*.{ext}")
    names = [n for n in names if "/" not in n]
    if not names:
        raise FileNotFoundError(f"{files.uri}: no {prefix}-*-of-*.{ext} shards")
    count = int(names[0].rsplit("-of-", 1)[1].split(".", 1)[0])
    expected = [shard_name(prefix, i, count, ext) for i in range(count)]
    if names != expected:
        raise FileNotFoundError(
            f"{files.uri}: incomplete or mixed shard set {names}; expected {count} shards"
        )
    return names


def list_shards(step_dir: str | Path, prefix: str, ext: str) -> list[Path]:
    """:func:`shard_names` of a local step directory, as paths ``step_dir / name``.

    Raises:
        FileNotFoundError: as :func:`shard_names`.
    """
    return [Path(step_dir) / name for name in shard_names(step_dir, prefix, ext)]


def iter_shard_rows(
    shard: str | Path,
    columns: Sequence[str] = ("id", "text"),
    batch_rows: int = 1024,
    *,
    files: StepFiles | None = None,
) -> Iterator[list[tuple[Any, ...]]]:
    """Rows of one document parquet shard as lists of up to ``batch_rows`` tuples (``columns``
    order), checking that ``id`` is strictly increasing (the clean step's contract). Only
    ``id`` and ``columns`` are read (from a bucket: the footer and those column chunks).

    Args:
        shard: the shard's name in ``files``; without ``files``, its location (a local path or a
            URI such as ``s3://bucket/root/step/documents-00000-of-00002.parquet``).

    Raises:
        FileNotFoundError: the shard does not exist, naming it.
        KeyError: if a column is missing, naming the file and its columns.
        ValueError: if the shard is not sorted by ``id``, naming the file and row number.
    """
    files, name = (files, str(shard)) if files is not None else StepFiles.of_file(shard)
    where = files.uri_of(name)
    with files.open_input(name) as source:
        parquet = pq.ParquetFile(source)
        names = parquet.schema_arrow.names
        missing = [c for c in ("id", *columns) if c not in names]
        if missing:
            raise KeyError(f"{where}: missing columns {missing}; it has {names}")
        wanted = list(dict.fromkeys(["id", *columns]))
        previous, row = None, 0
        for record_batch in parquet.iter_batches(batch_size=batch_rows, columns=wanted):
            data = record_batch.to_pydict()
            ids = data["id"]
            for doc_id in ids:
                if previous is not None and not previous < doc_id:
                    raise ValueError(
                        f"{where}: row {row} id {doc_id!r} is not greater than the previous id "
                        f"{previous!r}; document shards must be sorted by id with no repeats"
                    )
                previous, row = doc_id, row + 1
            yield list(zip(*(data[c] for c in columns)))


def iter_documents(
    step: StepFiles | str | Path, columns: Sequence[str] = ("id", "text")
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
    files = StepFiles.open(step)
    streams = [
        (row for batch in iter_shard_rows(name, columns, files=files) for row in batch)
        for name in shard_names(files, DOCUMENTS_PREFIX, "parquet")
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


def read_json(location: StepFiles | str | Path, name: str | None = None) -> dict[str, Any]:
    """Parse a JSON file: ``location`` itself, or file ``name`` of the step ``location``.

    Raises:
        FileNotFoundError: naming the file; ValueError: for malformed JSON, naming the file.
    """
    if name is None:
        files, name = StepFiles.of_file(location)
    else:
        files = StepFiles.open(location)
    return files.read_json(name)


def read_token_meta(step: StepFiles | str | Path) -> dict[str, Any]:
    """The ``meta.json`` of a tokenize or mix step (mix: ``mixture.json``), whichever exists.

    Raises:
        FileNotFoundError: neither exists, naming the step.
    """
    files = StepFiles.open(step)
    for name in (META_NAME, "mixture.json"):
        if files.exists(name):
            return files.read_json(name)
    raise FileNotFoundError(f"{files.uri}: neither {META_NAME} nor mixture.json")


def load_token_sequences(
    step: StepFiles | str | Path,
    tokenizer_hash: str | None = None,
    seq_len: int | None = None,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Sequences of a tokenize or mix step, shards concatenated in order:
    ``[n_sequences, seq_len]`` of the stored dtype (or ``[len(rows), seq_len]`` with ``rows``).

    Args:
        tokenizer_hash: if given, refuse data made with another tokenizer.
        seq_len: if given, refuse data packed to another sequence length (tokens).
        rows: if given, only these global sequence indices (1-D ints in ``[0, n_sequences)``,
            in this order): from a bucket only their bytes are fetched.

    Raises:
        TokenizerMismatch: naming the step and both hashes / lengths.
        ValueError: if a shard's dtype or width disagrees with the metadata.
        IndexError: a row outside ``[0, n_sequences)``.
    """
    files = StepFiles.open(step)
    meta = read_token_meta(files)
    if tokenizer_hash is not None and meta["tokenizer_hash"] != tokenizer_hash:
        raise TokenizerMismatch(
            f"{files.uri}: tokens were made with tokenizer {meta['tokenizer_hash']}, "
            f"but {tokenizer_hash} is required; re-tokenize with the model's tokenizer"
        )
    if seq_len is not None and meta["seq_len"] != seq_len:
        raise TokenizerMismatch(
            f"{files.uri}: seq_len is {meta['seq_len']}, but {seq_len} is required"
        )
    names = shard_names(files, TOKENS_PREFIX, "npy")
    parts = [files.array(name) for name in names]
    for name, part in zip(names, parts):
        if part.ndim != 2 or part.shape[1] != meta["seq_len"] or str(part.dtype) != meta["dtype"]:
            raise ValueError(
                f"{files.uri_of(name)}: shape {part.shape} dtype {part.dtype} disagrees with metadata "
                f"seq_len {meta['seq_len']} dtype {meta['dtype']}"
            )
    if rows is None:
        return np.concatenate([part[:] for part in parts], axis=0)
    rows = np.asarray(rows, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum([part.shape[0] for part in parts])]).astype(np.int64)
    if rows.size and (rows.min() < 0 or rows.max() >= starts[-1]):
        raise IndexError(f"{files.uri}: rows outside [0, {int(starts[-1])})")
    out = np.empty((rows.size, meta["seq_len"]), dtype=meta["dtype"])
    shard_of = np.searchsorted(starts, rows, side="right") - 1
    for shard in np.unique(shard_of):
        where = np.nonzero(shard_of == shard)[0]
        out[where] = parts[shard][rows[where] - starts[shard]]
    return out
