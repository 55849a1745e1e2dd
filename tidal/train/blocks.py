"""Block reads: the training stream as shuffled blocks of contiguous sequences, a pure function of the step.

Why: a loader that shuffles single sequences reads one range per sequence per step; from a bucket that is
one GET of a few KiB per row (256 GETs per host per step at sequence length 2,048 and 256 rows per host),
at tens of milliseconds each as long as a TPU step. Here each GET is a block of at least ``block_bytes``.

The order (``train.block_reads``, :class:`tidal.train.config.BlockReads`), for ``n`` sequences, a global
batch of ``B`` rows and blocks of ``R`` rows (``R = ceil(block_bytes / bytes per sequence)``, lowered to
``n // B`` when the data is small, so each batch row has at least one block):

* the ``n // R`` whole blocks are ``[b*R, (b+1)*R)``; epoch ``e`` permutes them with
  ``default_rng([seed, e])`` and deals ``L = (n // R) // B`` to each *lane*: row ``r`` of every batch of the
  epoch reads lane ``r``, blocks ``perm[r*L:(r+1)*L]``, so an epoch is ``L*R`` steps and the sequences of
  the ``n - B*L*R`` blocks and rows left over sit that epoch out (``unused_per_epoch``);
* a lane's step ``q`` of the epoch falls in window ``w = q // (W*R)`` (``W = window_blocks``); the rows of
  the window's blocks are shuffled with ``default_rng([seed, e, r, w])``, and step ``q`` reads the
  ``q % (W*R)``-th of them.

So the global batch of step ``s`` depends only on (seed, ``s``, n, B, R, W), never on how many hosts read
it, and a host reading rows ``[a, b)`` of each batch reads only lanes ``a..b-1``: ``W`` blocks per lane per
window, one GET each (two where a block crosses a shard boundary), kept in memory while the window is
read. GETs per step per host: ``(b - a) / R``.
"""

from __future__ import annotations

import functools
import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=8)
def _block_permutation(seed: int, epoch: int, n_blocks: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch]).permutation(n_blocks)
    perm.flags.writeable = False
    return perm


@functools.lru_cache(maxsize=1 << 16)
def _window_permutation(seed: int, epoch: int, lane: int, window: int, size: int) -> np.ndarray:
    perm = np.random.default_rng([seed, epoch, lane, window]).permutation(size)
    perm.flags.writeable = False
    return perm


class BlockOrder:
    """Which sequence each row of each batch reads (module docstring).

    Args:
        n_sequences: n, sequences in the data (> 0).
        batch_size: B, rows per global batch (> 0).
        seed: the step seed.
        row_bytes: bytes of one stored sequence (``seq_len * itemsize``).
        block_bytes: smallest block in bytes.
        window_blocks: W, blocks of a lane shuffled together.

    Raises:
        ValueError: fewer sequences than rows per batch (no block for every lane).
    """

    def __init__(self, n_sequences: int, batch_size: int, seed: int, row_bytes: int, block_bytes: int,
                 window_blocks: int):
        if n_sequences < batch_size:
            raise ValueError(f"block reads need at least one sequence per batch row: {n_sequences} sequences, "
                             f"batch_size {batch_size}")
        self.n, self.batch_size, self.seed, self.window_blocks = n_sequences, batch_size, seed, window_blocks
        self.block_rows = max(1, min(math.ceil(block_bytes / row_bytes), n_sequences // batch_size))
        self.n_blocks = n_sequences // self.block_rows
        self.lane_blocks = self.n_blocks // batch_size  # L
        self.steps_per_epoch = self.lane_blocks * self.block_rows
        self.unused_per_epoch = n_sequences - batch_size * self.steps_per_epoch

    def window_of(self, step: int) -> tuple[int, int]:
        """``(epoch, window)`` of 0-based ``step`` (the same for every lane)."""
        epoch, q = divmod(step, self.steps_per_epoch)
        return epoch, q // (self.window_blocks * self.block_rows)

    def window_blocks_of(self, epoch: int, window: int, lane: int) -> np.ndarray:
        """The block ids lane ``lane`` reads in ``window`` of ``epoch``, in order."""
        first = window * self.window_blocks
        last = min(first + self.window_blocks, self.lane_blocks)
        start = lane * self.lane_blocks
        return _block_permutation(self.seed, epoch, self.n_blocks)[start + first:start + last]

    def where(self, step: int, lanes: range) -> tuple[np.ndarray, np.ndarray]:
        """``(block ids, rows within the block)`` read by ``lanes`` at 0-based ``step``, each ``[len(lanes)]``."""
        epoch, q = divmod(step, self.steps_per_epoch)
        span = self.window_blocks * self.block_rows
        window, offset = divmod(q, span)
        blocks = np.empty(len(lanes), dtype=np.int64)
        rows = np.empty(len(lanes), dtype=np.int64)
        for i, lane in enumerate(lanes):
            owned = self.window_blocks_of(epoch, window, lane)
            k = int(_window_permutation(self.seed, epoch, lane, window, len(owned) * self.block_rows)[offset])
            blocks[i], rows[i] = owned[k // self.block_rows], k % self.block_rows
        return blocks, rows

    def indices(self, step: int, lanes: range | None = None) -> np.ndarray:
        """Global sequence indices (int64) read at 0-based ``step`` by ``lanes`` (default: all ``B``)."""
        blocks, rows = self.where(step, lanes if lanes is not None else range(self.batch_size))
        return blocks * self.block_rows + rows


class BlockCache:
    """The blocks a host's lanes are reading, fetched once each (one range of contiguous sequences) and
    dropped when the batches move past their window. Thread-safe: the loader reads ahead from threads.

    Args:
        read: ``read(first, stop) -> [stop - first, seq_len]`` token ids of sequences ``first..stop-1``.
        order: the :class:`BlockOrder`.
    """

    def __init__(self, read: Any, order: BlockOrder):
        self._read, self.order = read, order
        self._blocks: dict[tuple[int, int, int], Future] = {}  # (epoch, window, block) -> its rows
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tidal-blocks")
        self.fetched = 0  # blocks read

    def rows(self, step: int, lanes: range) -> np.ndarray:
        """``[len(lanes), seq_len]`` token ids of ``step`` for ``lanes``, the window's blocks fetched as needed
        (every block of the window at once, in parallel)."""
        order = self.order
        epoch, window = order.window_of(step)
        needed = {int(b) for lane in lanes for b in order.window_blocks_of(epoch, window, lane)}
        with self._lock:
            futures = {}
            for block in needed:
                key = (epoch, window, block)
                if key not in self._blocks:
                    first = block * order.block_rows
                    self._blocks[key] = self._pool.submit(self._read, first, first + order.block_rows)
                    self.fetched += 1
                futures[block] = self._blocks[key]
        blocks, within = order.where(step, lanes)
        return np.stack([futures[int(b)].result()[int(r)] for b, r in zip(blocks, within, strict=True)])

    def forget_before(self, step: int) -> None:
        """Drop the blocks of windows before ``step``'s (the batches are read in order past it)."""
        current = self.order.window_of(step)
        with self._lock:
            for key in [k for k in self._blocks if k[:2] < current]:
                del self._blocks[key]


__all__ = ["BlockCache", "BlockOrder"]
