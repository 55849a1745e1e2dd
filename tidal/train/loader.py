"""Packed-token reader: shards read in place, and batches that are a pure function of the step.

Invariant: ``BatchLoader.batch(step)`` depends only on (the shards' bytes, ``seed``,
``batch_size``, ``step``). Sequence positions ``step*B .. step*B+B-1`` of an endless stream
are read; position p lies in epoch ``e = p // n_sequences`` and names sequence
``perm_e[p % n_sequences]`` with ``perm_e = np.random.default_rng([seed, e]).permutation(n)``.
No state is carried between calls, so a resumed run reads exactly what an uninterrupted one
would, and every sequence is read once per epoch.

A reader refuses data whose tokenizer hash differs from the model's tokenizer
(docs/contracts.md, "Tokenized"), and token ids outside ``[0, vocab_size)``.
This module imports numpy only (no JAX), so inputs are checked before JAX starts.

Inputs are read in place (:class:`tidal.files.step_files.StepFiles`): on a local root the shards are
read-only memory maps; from a bucket a batch is one ranged GET per run of consecutive rows (a
``.npy`` is a header then row-major rows), fetched one step ahead of the trainer, and nothing
else of the shards is downloaded.
"""

from __future__ import annotations

import functools
import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from tidal.files.step_files import StepFiles
from tidal.train.blocks import BlockCache, BlockOrder

TOKEN_GLOB = "tokens-*.npy"
META_NAMES = ("mixture.json", "meta.json")  # mix step, tokenize step
TOKENIZER_META = "tokenizer_meta.json"
TOKENIZER_FILE = "tokenizer.json"
TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))
# batches read ahead from a bucket: enough to hide a few slow range requests behind the steps, few
# enough that the buffer stays small (PREFETCH x B x S token ids)
PREFETCH = 4


class DataContractError(ValueError):
    """An input directory breaks a data contract; the message names the file and the rule."""


def _read_json(files: StepFiles, name: str) -> dict[str, Any]:
    path = files.uri_of(name)
    try:
        data = json.loads(files.read_bytes(name))
    except FileNotFoundError:
        raise DataContractError(f"{path}: missing") from None
    except json.JSONDecodeError as err:
        raise DataContractError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise DataContractError(f"{path}: expected a JSON object")
    return data


def read_tokenizer_meta(directory: StepFiles | str | Path) -> dict[str, Any]:
    """Read ``tokenizer_meta.json`` = ``{"tokenizer_hash", "vocab_size", "eos_id"}`` of a tokenizer step.

    Raises:
        DataContractError: file missing/unreadable, a key missing, or ``vocab_size`` not a
            positive int.
    """
    files = StepFiles.open(directory)
    path = files.uri_of(TOKENIZER_META)
    meta = _read_json(files, TOKENIZER_META)
    for key in ("tokenizer_hash", "vocab_size"):
        if key not in meta:
            raise DataContractError(f"{path}: missing key {key!r}")
    if not isinstance(meta["vocab_size"], int) or meta["vocab_size"] <= 0:
        raise DataContractError(f"{path}: vocab_size must be a positive int, got {meta['vocab_size']!r}")
    return meta


class TokenShards:
    """The sequences of one tokenized/mixed step, read in place: read-only memory maps on a local
    root, range reads (:class:`tidal.files.npy.NpyRows`) from a bucket.

    Attributes:
        directory: the step's location (a directory path or a bucket URI), as a string.
        files: the step's :class:`tidal.files.step_files.StepFiles`.
        meta_path: its ``mixture.json`` or ``meta.json`` (location string).
        seq_len: S, tokens per sequence.
        n_sequences: total sequences over all shards (shards in sorted file-name order).
        tokenizer_hash: hash of the tokenizer that produced the ids.
        remote: True when the shards are read from a bucket.
    """

    def __init__(self, directory: StepFiles | str | Path, *, tokenizer_hash: str, tokenizer_dir: str | Path = "?",
                 prefix: str = ""):
        """Open and check every ``tokens-*.npy`` shard of the step ``directory`` (headers only); with
        ``prefix`` (``"heldout-"``: a tokenize step's held-out split, tidal/data/heldout.py) the
        ``{prefix}tokens-*.npy`` shards and their ``{prefix}meta.json``.

        Raises:
            DataContractError: no metadata file or shards; the metadata's ``tokenizer_hash``
                differs from ``tokenizer_hash`` (both hashes and the directory are named);
                a shard that is not 2-D uint16/uint32 with ``seq_len`` columns.
        """
        self.files = files = StepFiles.open(directory)
        self.directory, self.remote = files.uri, files.remote
        meta_name = next((f"{prefix}{n}" for n in META_NAMES if files.exists(f"{prefix}{n}")), None)
        if meta_name is None:
            raise DataContractError(f"{self.directory}: no {' or '.join(META_NAMES)} (token data metadata)")
        self.meta_path = meta_path = files.uri_of(meta_name)
        meta = _read_json(files, meta_name)
        for key in ("tokenizer_hash", "seq_len"):
            if key not in meta:
                raise DataContractError(f"{meta_path}: missing key {key!r}")
        self.tokenizer_hash = meta["tokenizer_hash"]
        if self.tokenizer_hash != tokenizer_hash:
            raise DataContractError(
                f"tokenizer hash mismatch: {meta_path} says the data was tokenized with "
                f"{self.tokenizer_hash!r}, but the model's tokenizer ({tokenizer_dir}) has hash "
                f"{tokenizer_hash!r}; rule: a reader refuses data whose tokenizer hash differs "
                f"from the model's (docs/contracts.md)")
        self.seq_len = int(meta["seq_len"])
        names = [n for n in files.names(prefix + TOKEN_GLOB) if "/" not in n]
        if not names:
            raise DataContractError(f"{self.directory}: no {prefix}{TOKEN_GLOB} shards")
        paths = [files.uri_of(n) for n in names]
        self.shards: list[Any] = []  # np.ndarray memory maps, or tidal.files.npy.NpyRows
        for name, path in zip(names, paths):
            try:
                arr = files.array(name)
            except ValueError as err:
                raise DataContractError(f"{err}; rule: tokens are .npy arrays") from None
            if arr.ndim != 2 or arr.shape[1] != self.seq_len or arr.dtype not in TOKEN_DTYPES:
                raise DataContractError(
                    f"{path}: shape {arr.shape} dtype {arr.dtype}; rule: tokens are "
                    f"uint16/uint32 of shape [n_seq, seq_len={self.seq_len}] ({meta_name})")
            self.shards.append(arr)
        self.paths = paths
        counts = np.array([a.shape[0] for a in self.shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self.n_sequences = int(self._starts[-1])
        if self.n_sequences == 0:
            raise DataContractError(f"{self.directory}: {prefix}{TOKEN_GLOB} shards hold no sequences")

    def locate(self, index: int) -> tuple[str, int]:
        """(shard location, row) of global sequence ``index``."""
        shard = int(np.searchsorted(self._starts, index, side="right") - 1)
        return self.paths[shard], int(index - self._starts[shard])

    def rows(self, indices: np.ndarray, vocab_size: int | None = None) -> np.ndarray:
        """Gather sequences by global index.

        Args:
            indices: ``[n]`` ints in ``[0, n_sequences)``.
            vocab_size: when given, every id must be below it.

        Returns:
            ``[n, seq_len]`` int32 token ids, in the order of ``indices``.

        Raises:
            DataContractError: a token id ``>= vocab_size`` (names shard file and row).
        """
        indices = np.asarray(indices, dtype=np.int64)
        out = np.empty((len(indices), self.seq_len), dtype=np.int32)
        shard_of = np.searchsorted(self._starts, indices, side="right") - 1
        for shard in np.unique(shard_of):
            where = np.nonzero(shard_of == shard)[0]
            local = indices[where] - self._starts[shard]
            out[where] = self.shards[shard][local]
        if vocab_size is not None and out.size and out.max() >= vocab_size:
            bad = int(np.nonzero((out >= vocab_size).any(axis=1))[0][0])
            path, row = self.locate(int(indices[bad]))
            raise DataContractError(f"{path} row {row}: token id {int(out[bad].max())} >= "
                                    f"vocab_size {vocab_size}; rule: ids come from the model's tokenizer")
        return out


@functools.lru_cache(maxsize=4)
def epoch_permutation(seed: int, epoch: int, n_sequences: int) -> np.ndarray:
    """Read-only permutation of ``range(n_sequences)`` for ``epoch``: ``default_rng([seed, epoch])``."""
    perm = np.random.default_rng([seed, epoch]).permutation(n_sequences)
    perm.flags.writeable = False
    return perm


class BatchLoader:
    """Batches of training sequences, each a pure function of (seed, step).

    When the shards are read from a bucket, :meth:`batch` keeps the next :data:`PREFETCH` batches
    being read in background threads (the trainer asks for consecutive steps), so the range reads'
    latency overlaps the training steps; a batch is still a pure function of the step, and a
    resumed run's first batch is read on demand.

    Args:
        shards: the training data: :class:`TokenShards`, or a load-time mixture
            (:class:`tidal.train.mixed.MixedShards`, ``ordered``: positions are read in order).
        batch_size: B, sequences per batch.
        seed: the step seed (non-negative int, e.g. 63-bit).
        vocab_size: when given, ids are checked against it on every batch.
        rows: the rows of each global batch this process reads (its addressable shard of the batch
            in a multi-process run, :func:`tidal.train.mesh.process_rows`); None: all ``B``.
        block_reads: ``(block_bytes, window_blocks)``: read shuffled blocks of contiguous sequences
            (:mod:`tidal.train.blocks`, ``train.block_reads``); None: shuffled single sequences.

    Raises:
        ValueError: ``batch_size`` not positive; with block reads, fewer sequences than ``batch_size``.
    """

    def __init__(self, shards: Any, batch_size: int, seed: int, vocab_size: int | None = None,
                 rows: slice | None = None, block_reads: tuple[int, int] | None = None):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.shards, self.batch_size, self.seed, self.vocab_size = shards, batch_size, seed, vocab_size
        self.rows = rows if rows is not None else slice(0, batch_size)
        self._ahead: dict[int, Future] = {}
        self._reader: ThreadPoolExecutor | None = None
        self.blocks: BlockCache | None = None
        self.ordered = bool(getattr(shards, "ordered", False))  # a load-time mixture: already in training order
        if block_reads is not None and self.ordered:
            raise ValueError("a load-time mixture is read in its own order (tidal/data/mixture_index.py); "
                             "leave train.block_reads out")
        if block_reads is not None:
            row_bytes = shards.seq_len * shards.shards[0].dtype.itemsize
            order = BlockOrder(shards.n_sequences, batch_size, seed, row_bytes, *block_reads)
            self.blocks = BlockCache(lambda first, stop: shards.rows(np.arange(first, stop), vocab_size), order)

    def indices(self, step: int) -> np.ndarray:
        """Global sequence indices ``[B]`` (int64) read at 0-based ``step``."""
        if self.blocks is not None:
            return self.blocks.order.indices(step)
        if self.ordered:  # stream positions; the mixture index shuffles and stages them
            return np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
        n = self.shards.n_sequences
        positions = np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
        epochs, offsets = np.divmod(positions, n)
        out = np.empty_like(positions)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = epoch_permutation(self.seed, int(epoch), n)[offsets[mask]]
        return out

    def _read(self, step: int) -> np.ndarray:
        if self.blocks is not None:
            return self.blocks.rows(step, range(self.rows.start, self.rows.stop))
        return self.shards.rows(self.indices(step)[self.rows], self.vocab_size)

    def batch(self, step: int) -> np.ndarray:
        """Token ids ``[rows, seq_len]`` int32 for 0-based ``step``: rows ``self.rows`` of the global
        ``[B, seq_len]`` batch (all of it in a one-process run).

        Raises:
            DataContractError: a token id outside the vocabulary.
        """
        ahead = self._ahead.pop(step, None)
        if any(s < step or s > step + PREFETCH for s in self._ahead):  # not consecutive: start over
            self._ahead.clear()
        out = ahead.result() if ahead is not None else self._read(step)
        if self.blocks is not None:
            self.blocks.forget_before(step)
        if self.shards.remote:
            if self._reader is None:
                self._reader = ThreadPoolExecutor(max_workers=PREFETCH, thread_name_prefix="tidal-batch-ahead")
            for later in range(step + 1, step + 1 + PREFETCH):
                if later not in self._ahead:
                    self._ahead[later] = self._reader.submit(self._read, later)
        return out


def eval_sequences(shards: TokenShards, n_batches: int, batch_size: int,
                   vocab_size: int | None = None) -> list[np.ndarray]:
    """Fixed evaluation batches: the first ``min(n_sequences, n_batches*B)`` sequences in order.

    Returns:
        A list of ``[<=B, seq_len]`` int32 arrays (the last one may be shorter).
    """
    n = min(shards.n_sequences, n_batches * batch_size)
    return [shards.rows(np.arange(i, min(i + batch_size, n)), vocab_size) for i in range(0, n, batch_size)]


def token_byte_lengths(directory: StepFiles | str | Path, vocab_size: int,
                       tokenizer_hash: str | None = None) -> np.ndarray | None:
    """UTF-8 bytes of text that each token id stands for, from ``directory/tokenizer.json``.

    Method (exact for tidal's tokenizers, which are all byte-level BPE, see
    tidal/data/tokenizer.py): in a byte-level vocabulary every symbol of a token's string is
    one byte mapped to a printable character (GPT-2's ``bytes_to_unicode``, the
    ``pre_tokenizers.ByteLevel.alphabet()``), so a token stands for ``len(token)`` bytes.
    Special tokens (the end-of-document id the packer inserts) stand for no text: 0 bytes.
    A token with symbols outside that alphabet (another kind of tokenizer) counts the UTF-8
    length of ``tokenizer.decode([id])``. The tokenize step's ``meta.json`` records no byte
    counts, hence this table; the bytes of the evaluated text are then
    ``lengths[targets].sum()``.

    Args:
        directory: the tokenizer step (a directory, a bucket URI or its StepFiles); its
            ``tokenizer.json`` is read in place and parsed from bytes (no local copy).
        vocab_size: V; ids ``>= len(vocabulary)`` count 0 bytes.
        tokenizer_hash: when given, the file's sha256 must equal it.

    Returns:
        ``[V]`` int64 byte counts, or None when the directory has no ``tokenizer.json`` (bits
        per byte are then not reported).

    Raises:
        DataContractError: the file's sha256 differs from ``tokenizer_hash``.
    """
    files = StepFiles.open(directory)
    path = files.uri_of(TOKENIZER_FILE)
    if not files.exists(TOKENIZER_FILE):
        return None
    import hashlib

    from tokenizers import Tokenizer, pre_tokenizers

    data = files.read_bytes(TOKENIZER_FILE)
    digest = hashlib.sha256(data).hexdigest()
    if tokenizer_hash is not None and digest != tokenizer_hash:
        raise DataContractError(f"{path}: sha256 {digest} differs from tokenizer_hash {tokenizer_hash!r} in "
                                f"{TOKENIZER_META}; rule: the tokenizer hash is the sha256 of tokenizer.json")
    tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    lengths = np.zeros(vocab_size, dtype=np.int64)
    for token_id in range(vocab_size):
        token = tokenizer.id_to_token(token_id)
        if token is None or token in special:
            continue
        if all(ch in alphabet for ch in token):
            lengths[token_id] = len(token)
        else:
            lengths[token_id] = len(tokenizer.decode([token_id]).encode("utf-8"))
    return lengths
