"""Block reads (tidal/train/blocks.py, ``train.block_reads``): the order is a pure function of the step,
every used sequence is read once per epoch, the global batch does not depend on how hosts split its rows,
each host fetches only its own lanes' blocks, one read per block."""

from __future__ import annotations

import numpy as np
import pytest

from tidal.train.blocks import BlockCache, BlockOrder

N, B, ROW_BYTES = 1000, 8, 128


def order(seed: int = 3, block_bytes: int = 16 * ROW_BYTES, window: int = 2, n: int = N, b: int = B) -> BlockOrder:
    return BlockOrder(n, b, seed, ROW_BYTES, block_bytes, window)


def test_an_epoch_reads_every_sequence_it_uses_once_and_counts_the_rest():
    o = order()
    assert (o.block_rows, o.n_blocks, o.lane_blocks) == (16, 62, 7)  # 1000 // 16 blocks, 62 // 8 per lane
    assert o.steps_per_epoch == 7 * 16 and o.unused_per_epoch == N - B * 7 * 16
    for epoch in (0, 1):
        seen = np.concatenate([o.indices(s) for s in range(epoch * o.steps_per_epoch,
                                                            (epoch + 1) * o.steps_per_epoch)])
        assert len(seen) == len(set(seen.tolist())) == B * o.steps_per_epoch  # no sequence twice in an epoch
        assert seen.min() >= 0 and seen.max() < N
    first, second = (set(np.concatenate([o.indices(s) for s in range(e * o.steps_per_epoch,
                                                                       (e + 1) * o.steps_per_epoch)]).tolist())
                     for e in (0, 1))
    assert first != second  # each epoch deals the blocks anew


def test_the_order_is_a_pure_function_of_seed_and_step_whatever_the_hosts():
    a, b = order(), order()
    for step in (0, 5, 31, 32, 111, 112, 500):
        whole = a.indices(step)
        np.testing.assert_array_equal(whole, b.indices(step))  # another process, same answer
        split = np.concatenate([a.indices(step, range(3)), a.indices(step, range(3, B))])
        np.testing.assert_array_equal(whole, split)  # 1 host or 2: the same global batch
    assert not np.array_equal(order(seed=4).indices(0), order().indices(0))


def test_rows_within_a_window_are_shuffled_and_blocks_are_contiguous_runs():
    o = order(window=2)
    lane0 = np.array([o.indices(s, range(1))[0] for s in range(2 * o.block_rows)])  # lane 0, its first window
    blocks = set((lane0 // o.block_rows).tolist())
    assert len(blocks) == 2 and sorted(lane0.tolist()) == sorted(
        r for b in blocks for r in range(b * o.block_rows, (b + 1) * o.block_rows))  # two whole blocks ...
    assert not np.all(np.diff(lane0) == 1)  # ... read in a shuffled order


def test_a_host_fetches_only_its_lanes_blocks_once_each():
    o = order()
    data = np.arange(N * 4, dtype=np.int32).reshape(N, 4)
    reads: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}

    def reader(host):
        return lambda first, stop: reads[host].append((first, stop)) or data[first:stop]

    hosts = {"a": (BlockCache(reader("a"), o), range(4)), "b": (BlockCache(reader("b"), o), range(4, B))}
    steps = 3 * 2 * o.block_rows  # three windows
    for step in range(steps):
        rows = []
        for cache, lanes in hosts.values():
            rows.append(cache.rows(step, lanes))
            cache.forget_before(step)
        np.testing.assert_array_equal(np.concatenate(rows), data[o.indices(step)])
    a, b = ({first // o.block_rows for first, _ in reads[h]} for h in ("a", "b"))
    assert not a & b  # disjoint: each host reads its own lanes' blocks only
    assert all(stop - first == o.block_rows for h in reads for first, stop in reads[h])  # whole blocks
    assert len(reads["a"]) == len(set(reads["a"])) == 4 * 3 * 2  # once each: lanes x windows x W
    assert len(reads["a"]) / steps == pytest.approx(4 / o.block_rows)  # GETs per step per host: rows / R


def test_small_data_gets_smaller_blocks_and_too_little_is_refused():
    assert order(n=100, block_bytes=1 << 20).block_rows == 100 // B
    with pytest.raises(ValueError, match="at least one sequence per batch row"):
        order(n=B - 1)
