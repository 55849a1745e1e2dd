"""Load-time mixing: the mixture as a pure function from a global sequence position to (source, row).

Why: a mixture of copied tokens goes through one process and is written again at every change of a
weight. A load-time mixture (``mixture.load_time: true``) is this function and a few numbers in
``mixture.json``; the trainer reads each position's row straight from the tokenize step it names, and a
reweighted or restaged mixture rewrites only ``mixture.json``.

The function (``K`` = ``block_sequences``, sources in sorted name order):

* Positions come in blocks of ``K``: block ``b`` holds positions ``[b*K, (b+1)*K)``. A stage covers a run of
  whole blocks and has per-block counts ``c[s]`` (largest-remainder of its weights over ``K``, summing to
  ``K``). Every block of the stage holds exactly ``c[s]`` positions of source ``s`` (the prefix-sum rule of
  Levanter's mixture: after ``m`` blocks of a stage each source has exactly ``m * c[s]``).
* Inside block ``b`` offset ``o`` goes to slot ``t = P_b(o)`` of the block's slots laid out source after
  source (``c[0]`` slots of the first, then the second ...). ``P_b`` is a keyed pseudo-random permutation of
  ``range(K)`` (below), so which offsets hold which source is shuffled within every block.
* The position is the ``j``-th draw of its source: ``j`` = the source's draws in earlier blocks (a sum over
  stages) + ``t`` minus the source's first slot.
* Draw ``j`` of a source with ``n`` sequences is pass ``e = j // n``, row ``Q_{s,e}(j % n)``, ``Q`` again a
  keyed permutation: every pass reads each row once, in a new order.

The permutations are a 4-round Feistel network over the smallest even-bit power of two ``>= n`` with cycle
walking (Black and Rogaway, "Ciphers with Arbitrary Finite Domains", CT-RSA 2002), keyed by
``SeedSequence([seed, purpose, ...])`` and a splitmix64 round function (Steele et al., OOPSLA 2014): any
position is located in O(1) time and memory, vectorized, with no table of ``n`` entries held by any host.
So the batch of a step is a pure function of (seed, the weights, the stage boundaries, each source's
``n``), whatever the hosts, and a resumed run (across a stage boundary too) reads what an uninterrupted
one reads. Numpy only: the mix step and the trainer's loader both import it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from tidal.data.mix_sizing import MixtureError, largest_remainder_counts

__all__ = ["DEFAULT_BLOCK_SEQUENCES", "MixtureIndex", "Stage", "permute"]

DEFAULT_BLOCK_SEQUENCES = 1024  # Levanter's mixture block is of the same order; a batch spans at most a few
_LABELS, _ROWS = 1, 2  # key purposes
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_ROUNDS = 4
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # multiplication modulo 2**64 is the point
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@functools.lru_cache(maxsize=64)
def _base_keys(seed: int, purpose: int) -> tuple[np.uint64, ...]:
    state = np.random.SeedSequence([int(seed), int(purpose)]).generate_state(_ROUNDS, dtype=np.uint64)
    return tuple(np.uint64(k) for k in state)


def _keys(seed: int, purpose: int, *words: np.ndarray | int) -> list[np.ndarray]:
    """Round keys per element: the ``SeedSequence([seed, purpose])`` keys mixed with the element's words
    (block, or source and pass) through splitmix64, so one call keys a whole batch."""
    h = np.zeros(np.broadcast(*[np.asarray(w) for w in words]).shape, dtype=np.uint64)
    for word in words:
        with np.errstate(over="ignore"):
            h = _splitmix(h ^ (np.asarray(word).astype(np.uint64) + _GOLDEN))
    return [_splitmix(key ^ h) for key in _base_keys(seed, purpose)]


def _encrypt(x: np.ndarray, half: int, keys: Sequence[np.ndarray]) -> np.ndarray:
    shift, mask = np.uint64(half), np.uint64((1 << half) - 1)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (_splitmix(right ^ key) & mask)
    return (left << shift) | right


def permute(x: np.ndarray, n: int, keys: Sequence[np.ndarray]) -> np.ndarray:
    """A keyed bijection of ``range(n)`` applied to ``x`` (module docstring: Feistel with cycle walking).

    Args:
        x: int array, every value in ``[0, n)``.
        n: the domain size, ``>= 1``.
        keys: four uint64 round keys, each an array broadcastable to ``x`` (one key per element: elements
            with equal keys are permuted by the same bijection).

    Returns:
        int64 array of ``x``'s shape, values in ``[0, n)``; distinct inputs under one key give distinct outputs.
    """
    half = max(1, -(-max(int(n - 1).bit_length(), 1) // 2))
    shape = np.shape(x)
    flat = np.asarray(x, dtype=np.uint64).reshape(-1)
    keys = [np.broadcast_to(k, shape).reshape(-1) for k in keys]
    y = _encrypt(flat, half, keys)
    outside = np.nonzero(y >= np.uint64(n))[0]
    while outside.size:  # a cycle of the 2^(2*half) domain comes back into [0, n)
        y[outside] = _encrypt(y[outside], half, [k[outside] for k in keys])
        outside = outside[y[outside] >= np.uint64(n)]
    return y.astype(np.int64).reshape(shape)


@dataclass(frozen=True)
class Stage:
    """One stage of a load-time mixture: from block ``start_block`` on, ``counts[i]`` positions of every block
    go to source ``i`` (sorted source order; they sum to the block size)."""

    start_block: int
    counts: tuple[int, ...]


def stage_counts(weights: Mapping[str, Fraction], sources: Sequence[str], block: int) -> tuple[int, ...]:
    """Per-block counts of a stage: :func:`largest_remainder_counts` of ``weights`` (normalized, summing to 1;
    sources left out get 0) over ``block`` positions, in ``sources`` order."""
    counts = largest_remainder_counts(dict(weights), block)
    return tuple(counts.get(src, 0) for src in sources)


class MixtureIndex:
    """The load-time mixture function (module docstring).

    Args:
        sources: source names, sorted.
        available: sequences per source (each ``>= 1`` where any stage draws from it).
        seed: the mix step's seed.
        block: ``K``, positions per block.
        stages: at least one; the first starts at block 0, starts strictly increase; the last runs on for
            ever (positions past the mixture's size keep drawing from it).

    Raises:
        MixtureError: a stage that draws from a source with no sequences, counts that do not sum to ``K``,
            or starts that do not increase from 0.
    """

    def __init__(self, sources: Sequence[str], available: Mapping[str, int], seed: int, block: int,
                 stages: Sequence[Stage]):
        self.sources, self.seed, self.block = list(sources), int(seed), int(block)
        self.available = np.array([int(available[s]) for s in self.sources], dtype=np.int64)
        self.stages = list(stages)
        starts = [st.start_block for st in self.stages]
        if not starts or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
            raise MixtureError(f"mixture stages must start at block 0 and increase, got start blocks {starts}")
        self.counts = np.array([st.counts for st in self.stages], dtype=np.int64)  # [stages, sources]
        if self.counts.shape[1] != len(self.sources) or (self.counts.sum(axis=1) != self.block).any():
            raise MixtureError(f"every stage's counts must cover the {self.block} positions of a block")
        empty = [self.sources[i] for i in np.nonzero((self.counts.sum(axis=0) > 0) & (self.available == 0))[0]]
        if empty:
            raise MixtureError(f"sources {empty} have no sequences but a stage draws from them")
        self.starts = np.array(starts, dtype=np.int64)
        self.slot_start = np.concatenate([np.zeros((len(stages), 1), np.int64), np.cumsum(self.counts, axis=1)],
                                         axis=1)  # [stages, sources + 1]
        lengths = np.diff(self.starts)
        self.before = np.concatenate([np.zeros((1, len(self.sources)), np.int64),
                                      np.cumsum(lengths[:, None] * self.counts[:-1], axis=0)])  # draws before a stage

    def _draws(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = np.asarray(positions, dtype=np.int64)
        if p.size and p.min() < 0:
            raise ValueError("mixture positions are >= 0")
        blocks, offsets = np.divmod(p, self.block)
        slots = permute(offsets, self.block, _keys(self.seed, _LABELS, blocks))
        stage = np.searchsorted(self.starts, blocks, side="right") - 1
        src = np.empty_like(p)
        for st in np.unique(stage):
            here = stage == st
            src[here] = np.searchsorted(self.slot_start[st], slots[here], side="right") - 1
        draw = (self.before[stage, src] + (blocks - self.starts[stage]) * self.counts[stage, src]
                + slots - self.slot_start[stage, src])
        return src, draw

    def sources_of(self, positions: np.ndarray) -> np.ndarray:
        """Source index (into :attr:`sources`) of each position, ``[n]`` int64."""
        return self._draws(positions)[0]

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source index [n], row [n])`` of each global sequence position (int64 arrays).

        Raises:
            ValueError: a negative position.
        """
        src, draw = self._draws(positions)
        n = self.available[src]
        passes, within = np.divmod(draw, np.maximum(n, 1))
        rows = np.empty_like(draw)
        for s in np.unique(src):  # the domain differs per source; the pass is in the key
            here = np.nonzero(src == s)[0]
            rows[here] = permute(within[here], int(self.available[s]), _keys(self.seed, _ROWS, s, passes[here]))
        return src, rows

    def stage_at(self, block: int) -> int:
        """The stage index of block ``block``."""
        return int(np.searchsorted(self.starts, block, side="right") - 1)

    def drawn(self, n_positions: int) -> np.ndarray:
        """Draws of each source among positions ``[0, n_positions)``: ``[sources]`` int64, exact (whole blocks
        by the stage counts, the last partial block by locating its positions)."""
        whole, rest = divmod(int(n_positions), self.block)
        st = self.stage_at(whole) if whole else 0
        out = (self.before[st] + (whole - self.starts[st]) * self.counts[st]) if whole else np.zeros(
            len(self.sources), np.int64)
        if rest:
            out = out + np.bincount(self.sources_of(np.arange(whole * self.block, whole * self.block + rest)),
                                    minlength=len(self.sources))
        return out.astype(np.int64)

    def check_block(self, block: int) -> None:
        """Recount block ``block`` position by position against its stage's counts (the gate's check).

        Raises:
            MixtureError: the realized counts differ (names the block, the stage and both counts).
        """
        found = np.bincount(self.sources_of(np.arange(block * self.block, (block + 1) * self.block)),
                            minlength=len(self.sources))
        stage = self.stage_at(block)
        if not np.array_equal(found, self.counts[stage]):
            raise MixtureError(f"block {block} (stage {stage}) realizes counts {found.tolist()}, its stage "
                               f"says {self.counts[stage].tolist()}; rule: every block holds its stage's counts")

    def to_json(self) -> dict[str, Any]:
        """What ``mixture.json`` records under ``index`` (enough to rebuild this object)."""
        return {"block_sequences": self.block, "seed": self.seed,
                "available": {s: int(n) for s, n in zip(self.sources, self.available)},
                "stages": [{"start_block": st.start_block, "counts": dict(zip(self.sources, st.counts))}
                           for st in self.stages]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], sources: Sequence[str]) -> MixtureIndex:
        """Rebuild from :meth:`to_json`'s dict.

        Raises:
            MixtureError: a field missing or of the wrong type (named).
        """
        try:
            return cls(sources, {s: int(data["available"][s]) for s in sources}, int(data["seed"]),
                       int(data["block_sequences"]),
                       [Stage(int(st["start_block"]), tuple(int(st["counts"].get(s, 0)) for s in sources))
                        for st in data["stages"]])
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise MixtureError(f"mixture index: missing or malformed field ({type(err).__name__}: {err})") from None
