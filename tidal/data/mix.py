"""Mix step: a deterministic weighted mixture of tokenized sources, sized by ``mixture.size``.

Invariant: the mixture is a pure function of the weights, the size, the input shards and
``ctx.seed``. Counts per source come from :mod:`tidal.data.mix_sizing` (exact fractions,
largest-remainder rounding; the same arithmetic ``tidal plan`` shows). One
``np.random.default_rng(ctx.seed)`` then draws, in sorted source order, a permutation of each
source's sequences, and finally a permutation of the whole mixture (the interleaving).

Up-sampling (``size: {mode: token_budget, max_epochs: E > 1}``): a source that gives ``count =
q * available + r`` sequences contributes its seeded permutation ``q`` times (every sequence once
per whole pass) and then the first ``r`` rows of that same permutation (the partial pass, a seeded
subset: no sequence appears more than ``ceil(count / available)`` times, and the ``r`` repeated
once more are a uniform choice). The one interleaving permutation then orders the whole mixture, so
copies of a sequence sit at random positions rather than pass after pass. A source that gives at
most what it has (every ``smallest_source`` mixture) takes the first ``count`` rows of its
permutation, the same rows and bytes as before up-sampling existed.

This is plain numpy, not Beam: it moves whole sequences by index (a gather of a few
hundred MB at most for the model sizes this step serves) and needs the global counts
first; a distributed shuffle would add nothing but non-trivial determinism work. Inputs are
read in place: each source's ``meta.json`` and only the picked rows of its token shards (each
row fetched once, however often it is repeated).

A load-time mixture (``mixture.load_time: true``) copies nothing: :mod:`tidal.data.mix_load_time` writes
its index instead.

Config (:class:`tidal.data.mix_config.MixConfig`): weights {src: w > 0}, inputs {src: tokenize
step name}, shards (output count), size (``smallest_source`` by default; ``token_budget``),
n_sequences (smallest_source only; None: the largest N whose largest-remainder counts fit every
source), seed (the recipe's; hashed only).
Outputs: ``tokens-*.npy`` ``[n_sequences, seq_len]``, ``sources.npy`` (``[n_sequences]``
uint8 index into ``mixture.json["sources"]``), ``mixture.json`` ``{requested (normalized
weights), realized (count / n_sequences), counts, n_sequences, tokenizer_hash, seq_len,
dtype, sources}``, plus, for a ``token_budget`` mixture only (so smallest_source outputs keep
their bytes), ``size`` (the config) and ``epochs`` (count / available per source).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

import tidal.data.jobcli
import tidal.data.mix_load_time
from tidal.context import StepContext
from tidal.data.mix_config import MixConfig
from tidal.data.mix_output import mix_metrics, write_mixture
from tidal.data.mix_sizing import (
    MixtureError,
    largest_feasible_total,
    largest_remainder_counts,
    normalize_weights,
    plan_table,
    size_mixture,
)
from tidal.data.shards import load_token_sequences, write_token_shards

__all__ = [
    "MixtureError", "largest_feasible_total", "largest_remainder_counts", "mixture_order", "normalize_weights",
    "run",
]

STEP_VERSION = 1
SOURCES_FILE = "sources.npy"
MAX_SOURCES = 256  # sources.npy is uint8


def mixture_order(
    available: dict[str, int], counts: dict[str, int], seed: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Seeded choice and order of sequences (module docstring: up-sampling).

    Returns:
        ``(picked, interleave)``: ``picked[src]`` is a 1-D int64 array of ``counts[src]``
        row indices into that source (its seeded permutation repeated ``counts // available``
        times, then the first ``counts % available`` of it); ``interleave`` is a permutation of
        ``sum(counts)`` positions of the concatenation (sorted source order).
    """
    rng = np.random.default_rng(seed)
    picked = {}
    for src in sorted(counts):
        perm = rng.permutation(available[src])
        passes, rest = divmod(counts[src], available[src]) if available[src] else (0, 0)
        picked[src] = np.concatenate([*([perm] * passes), perm[:rest]]) if passes else perm[: counts[src]]
    interleave = rng.permutation(sum(counts.values()))
    return picked, interleave


def _check_inputs(ctx: StepContext, weights: dict, inputs: dict) -> dict[str, dict]:
    missing = sorted(set(weights) - set(inputs))
    unweighted = sorted(set(inputs) - set(weights))
    if missing or unweighted:
        raise MixtureError(
            f"step {ctx.name}: sources with a weight but no input {missing}, with an input but no weight "
            f"{unweighted}; every mixture source needs both"
        )
    metas = {src: ctx.input_files(inputs[src]).read_json("meta.json") for src in sorted(inputs)}
    for field in ("tokenizer_hash", "seq_len", "dtype"):
        values = {src: meta[field] for src, meta in metas.items()}
        if len(set(values.values())) > 1:
            raise MixtureError(
                f"step {ctx.name}: inputs disagree on {field}: {values}; re-tokenize them alike"
            )
    return metas


def run(ctx: StepContext) -> dict:
    """Build and write the mixture (see the module docstring); log its table (per source: tokens
    available, weight, tokens taken, epochs, tokens unused).

    Returns:
        ``{"n_sequences", "n_tokens", "tokens_unused", "sequences/<src>", "epochs/<src>",
        "tokens_unused/<src>"}`` (tokens unused: a source's tokens never taken).

    Raises:
        MixtureError: weights without input (or the reverse), inputs with different
            tokenizer hash / seq_len / dtype, more than 256 sources, an empty mixture, or counts a
            source cannot give (``n_sequences`` beyond its sequences, or a ``token_budget`` share
            beyond ``max_epochs`` passes; the message names ``mixture.size`` and the source).
    """
    cfg: MixConfig = ctx.config  # parsed once, at plan time (or by the job command)
    inputs = cfg.inputs
    metas = _check_inputs(ctx, cfg.weights, inputs)
    weights = normalize_weights(cfg.weights)
    if len(weights) > MAX_SOURCES:
        raise MixtureError(
            f"step {ctx.name}: {len(weights)} sources, at most {MAX_SOURCES} fit sources.npy (uint8)"
        )
    if cfg.load_time:  # an index over the tokenized sources, no tokens copied
        return tidal.data.mix_load_time.run(ctx, cfg, metas)
    available = {src: int(meta["n_sequences"]) for src, meta in metas.items()}
    sources = sorted(weights)
    seq_len, tokenizer_hash = metas[sources[0]]["seq_len"], metas[sources[0]]["tokenizer_hash"]
    try:
        counts = size_mixture(weights, available, seq_len, cfg.size, cfg.n_sequences)
    except MixtureError as err:
        raise MixtureError(f"step {ctx.name}: {err}") from None
    total = sum(counts.values())
    table = plan_table(cfg.weights, seq_len, cfg.size, cfg.n_sequences, available)
    for line in table.lines():
        ctx.log.info("%s", line)
    picked, interleave = mixture_order(available, counts, ctx.require_seed())
    blocks, labels = [], []
    for index, src in enumerate(sources):
        unique, inverse = np.unique(picked[src], return_inverse=True)  # a repeated row is fetched once
        rows = load_token_sequences(  # only the picked rows: range reads from a bucket
            ctx.input_files(inputs[src]), tokenizer_hash=tokenizer_hash, seq_len=seq_len, rows=unique
        )
        blocks.append(rows[inverse.reshape(-1)])
        labels.append(np.full(counts[src], index, dtype=np.uint8))
    tokens = np.concatenate(blocks, axis=0)[interleave]
    source_index = np.concatenate(labels)[interleave]
    write_token_shards(ctx.out_dir, tokens, cfg.shards)
    np.save(Path(ctx.out_dir) / SOURCES_FILE, source_index, allow_pickle=False)
    mixture = {
        "requested": {src: float(w) for src, w in weights.items()},
        "realized": {src: counts[src] / total for src in sources},
        "counts": counts,
        "n_sequences": total,
        "tokenizer_hash": tokenizer_hash,
        "seq_len": seq_len,
        "dtype": metas[sources[0]]["dtype"],
        "sources": sources,
    }
    write_mixture(ctx.out_dir, mixture, cfg.size, counts, available)
    return mix_metrics(replace(table, taken=counts), counts, seq_len)


if __name__ == "__main__":
    tidal.data.jobcli.main(sys.modules[__name__], "mix")
