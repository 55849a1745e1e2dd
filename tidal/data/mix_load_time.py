"""The mix step of a load-time mixture (``mixture.load_time: true``): it writes ``mixture.json`` with the
index (:mod:`tidal.data.mixture_index`) and no tokens.

Sizing is the copied mixture's (``mixture.size``), counted on the index: ``token_budget`` gives ``N =
ceil(tokens / seq_len)`` positions and each source's draws among them must fit ``max_epochs`` passes;
``smallest_source`` gives the largest ``N`` whose draws repeat no sequence (or ``n_sequences``, which must not).
Stage ends become whole blocks: ``until_fraction f`` ends at block ``round(f * N / K)``, ``until_step u`` at
``round(u * batch_size / K)`` (Python's round: halves to even).

The gate on the index: the first and last block of every stage and up to :data:`CHECKED_BLOCKS` seeded others
are recounted position by position against their stage's counts (:meth:`MixtureIndex.check_block`) before
``mixture.json`` is written; ``stage_counts_exact`` is recorded. (Every block could be recounted; at a
billion sequences that is minutes of one process for a property that holds by construction.)

``mixture.json`` keeps every key a copied mixture writes (``requested``, ``realized``, ``counts``,
``n_sequences``, ``tokenizer_hash``, ``seq_len``, ``dtype``, ``sources``, and ``size``/``epochs`` for a
token budget), so stats, the gate, ``tidal plan`` and ``tidal report`` read it unchanged, and adds
``load_time``: ``{inputs: {source: tokenize step}, index: MixtureIndex.to_json(), stages: [{start_sequence,
end_sequence, counts_per_block, drawn}], stage_counts_exact}``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from tidal.context import StepContext
from tidal.data.mix_config import MixConfig
from tidal.data.mix_output import mix_metrics, write_mixture
from tidal.data.mix_sizing import (
    MixtureError,
    max_taken,
    normalize_weights,
    plan_table,
    requested_total,
)
from tidal.data.mixture_index import MixtureIndex, Stage, stage_counts

CHECKED_BLOCKS = 64


def stage_blocks(cfg: MixConfig, n_sequences: int) -> list[int]:
    """Start block of every stage (the first is 0), from the stage ends (module docstring).

    Raises:
        MixtureError: two stages meet at the same block after rounding (names them and ``block_sequences``).
    """
    block = cfg.block_sequences
    starts = [0]
    for i, stage in enumerate(cfg.stages or ()):
        if stage.until_fraction is None and stage.until_step is None:
            break
        end = stage.until_fraction * n_sequences if stage.until_fraction is not None else (
            stage.until_step * cfg.batch_size)
        start = round(end / block)
        if start <= starts[-1]:
            raise MixtureError(f"mixture.stages[{i}] ends at sequence {end:,.0f}, which rounds to block {start} of "
                               f"{block} sequences, not after the stage's start (block {starts[-1]}); lower "
                               "mixture.block_sequences or move the stage's end")
        starts.append(start)
    return starts


def build_index(cfg: MixConfig, available: dict[str, int], seed: int, n_sequences: int) -> MixtureIndex:
    """The index for ``n_sequences`` positions (stage ends depend on it)."""
    sources = sorted(cfg.weights)
    weights = [st.weights for st in cfg.stages] if cfg.stages else [cfg.weights]
    starts = stage_blocks(cfg, n_sequences)
    stages = [Stage(start, stage_counts(normalize_weights(w), sources, cfg.block_sequences))
              for start, w in zip(starts, weights)]
    return MixtureIndex(sources, available, seed, cfg.block_sequences, stages)


def _size(cfg: MixConfig, available: dict[str, int], seq_len: int, seed: int) -> tuple[int, MixtureIndex]:
    """``(N, index)``: module docstring's sizing.

    Raises:
        MixtureError: a source cannot give its draws (names the source, the draws and what it has).
    """
    sources = sorted(cfg.weights)
    total = requested_total(cfg.size, cfg.n_sequences, seq_len)
    if total is None:  # smallest_source: the largest N whose draws fit every source once (draws grow with N)
        index = build_index(cfg, available, seed, 1)
        have = np.array([available[s] for s in sources])
        low, high = 0, int(have.sum()) + 1
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if (index.drawn(middle) <= have).all() else (low, middle)
        total = low
    if total <= 0:
        raise MixtureError("the mixture is empty: a source with weight has no sequences")
    index = build_index(cfg, available, seed, total)
    drawn = index.drawn(total)
    for src, count in zip(sources, drawn):
        most = max_taken(available[src], cfg.size)
        if count > most:
            raise MixtureError(
                f"source {src!r} gives {available[src]:,} sequences and the mixture draws {int(count):,} of them "
                f"(mixture.size: {cfg.size.model_dump()}); at most {most:,}: raise size.max_epochs, lower its "
                "weight, or add text")
    return total, index


def checked_blocks(index: MixtureIndex, n_sequences: int, seed: int) -> list[int]:
    """The blocks the gate recounts: first and last of every stage within the mixture, plus a seeded sample."""
    last = max(0, (n_sequences - 1) // index.block)
    ends = [*index.starts[1:].tolist(), last + 1]
    picked = {b for start, end in zip(index.starts.tolist(), ends) if start <= last
              for b in (start, min(end, last + 1) - 1)}
    sample = np.random.default_rng([seed, 3]).choice(last + 1, size=min(CHECKED_BLOCKS, last + 1), replace=False)
    return sorted(picked | {int(b) for b in sample})


def run(ctx: StepContext, cfg: MixConfig, metas: dict[str, dict]) -> dict[str, Any]:
    """Write the load-time ``mixture.json`` (module docstring); return the same metrics as a copied mixture's
    :func:`tidal.data.mix.run` plus ``stage_counts_exact`` (1) and ``stages``.

    Raises:
        MixtureError: a source cannot give its draws, stage ends that meet after rounding, or a recounted block
            that differs from its stage (the gate).
    """
    sources = sorted(cfg.weights)
    available = {src: int(metas[src]["n_sequences"]) for src in sources}
    first = metas[sources[0]]
    seq_len, seed = int(first["seq_len"]), ctx.require_seed()
    try:
        total, index = _size(cfg, available, seq_len, seed)
        for block in checked_blocks(index, total, seed):
            index.check_block(block)
    except MixtureError as err:
        raise MixtureError(f"step {ctx.name}: {err}") from None
    drawn = index.drawn(total)
    counts = {src: int(c) for src, c in zip(sources, drawn)}
    table = replace(plan_table(cfg.weights, seq_len, cfg.size, cfg.n_sequences, available), taken=counts)
    for line in table.lines():
        ctx.log.info("%s", line)
    ends = [*(int(b) * index.block for b in index.starts[1:]), None]
    stages = []
    for i, (start, end) in enumerate(zip(index.starts.tolist(), ends)):
        stop = total if end is None else min(end, total)
        part = index.drawn(stop) - index.drawn(min(start * index.block, total))
        stages.append({"start_sequence": start * index.block, "end_sequence": end,
                       "counts_per_block": dict(zip(sources, index.counts[i].tolist())),
                       "drawn": dict(zip(sources, part.tolist()))})
        ctx.log.info("stage %d: sequences %s..%s, per block of %d %s", i, f"{start * index.block:,}",
                     "end" if end is None else f"{end:,}", index.block, stages[-1]["counts_per_block"])
    weights = normalize_weights(cfg.expected_weights(seq_len, cfg.batch_size))  # staged: each stage by its share
    mixture = {
        "requested": {src: float(w) for src, w in weights.items()},
        "realized": {src: counts[src] / total for src in sources},
        "counts": counts, "n_sequences": total, "tokenizer_hash": first["tokenizer_hash"], "seq_len": seq_len,
        "dtype": first["dtype"], "sources": sources,
        "load_time": {"inputs": dict(sorted(cfg.inputs.items())), "index": index.to_json(), "stages": stages,
                      "stage_counts_exact": True},
    }
    write_mixture(ctx.out_dir, mixture, cfg.size, counts, available)
    return {**mix_metrics(table, counts, seq_len), "stage_counts_exact": 1, "stages": len(stages)}
