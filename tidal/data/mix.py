"""Mix step: a deterministic weighted mixture of tokenized sources, without repetition.

Invariant: the mixture is a pure function of the weights, the input shards and
``ctx.seed``. Per-source counts come from exact rational arithmetic (``fractions.Fraction``
of the weights' decimal forms) with largest-remainder rounding, ties going to the earlier source in
sorted name order, so the counts are the same on every machine. One
``np.random.default_rng(ctx.seed)`` then draws, in sorted source order, a permutation of
each source's sequences (the first ``count`` are taken) and finally a permutation of the
whole mixture (the interleaving).

This is plain numpy, not Beam: it moves whole sequences by index (a gather of a few
hundred MB at most for the model sizes this step serves) and needs the global counts
first; a distributed shuffle would add nothing but non-trivial determinism work. Inputs are
read in place: each source's ``meta.json`` and only the picked rows of its token shards.

Config (:class:`tidal.data.mix_config.MixConfig`): weights {src: w > 0}, inputs {src: tokenize
step name}, shards (output count), n_sequences (None: the largest N whose largest-remainder
counts fit every source), seed (the recipe's; hashed only).
Outputs: ``tokens-*.npy`` ``[n_sequences, seq_len]``, ``sources.npy`` (``[n_sequences]``
uint8 index into ``mixture.json["sources"]``), ``mixture.json`` ``{requested (normalized
weights), realized (count / n_sequences), counts, n_sequences, tokenizer_hash, seq_len,
dtype, sources}``.
"""

from __future__ import annotations

import json
import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

import tidal.data.jobcli
from tidal.context import StepContext
from tidal.data.mix_config import MixConfig
from tidal.data.shards import load_token_sequences, write_token_shards

STEP_VERSION = 1
MIXTURE_FILE = "mixture.json"
SOURCES_FILE = "sources.npy"
MAX_SOURCES = 256  # sources.npy is uint8


class MixtureError(ValueError):
    """The mixture cannot be built as configured (mismatched inputs, too few sequences ...)."""


def normalize_weights(weights: dict[str, float]) -> dict[str, Fraction]:
    """Weights as exact fractions summing to 1, keyed in sorted source order.

    Each weight is read as the decimal it is written as (``Fraction(repr(w))``: 0.3 -> 3/10,
    not the binary double just below it), so counts match what a person computes by hand.

    Raises:
        MixtureError: for an empty mapping or a weight that is not finite and > 0.
    """
    if not weights:
        raise MixtureError("mixture weights are empty")
    bad = {
        src: w
        for src, w in weights.items()
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0)
    }
    if bad:
        raise MixtureError(f"mixture weights must be finite and > 0, got {bad}")
    exact = {src: Fraction(repr(float(weights[src]))) for src in sorted(weights)}
    total = sum(exact.values())
    return {src: w / total for src, w in exact.items()}


def largest_remainder_counts(weights: dict[str, Fraction], total: int) -> dict[str, int]:
    """Split ``total`` sequences by ``weights`` (summing to 1): each source gets
    ``floor(w * total)`` and the leftover sequences go one each to the largest remainders
    (Hamilton's method), ties to the earlier source in ``weights`` order.

    Returns:
        ``{src: count}`` with counts summing to ``total``.
    """
    shares = {src: w * total for src, w in weights.items()}
    counts = {src: math.floor(share) for src, share in shares.items()}
    leftover = total - sum(counts.values())
    order = sorted(
        weights, key=lambda src: (-(shares[src] - counts[src]), list(weights).index(src))
    )
    for src in order[:leftover]:
        counts[src] += 1
    return counts


def largest_feasible_total(weights: dict[str, Fraction], available: dict[str, int]) -> int:
    """The largest N whose :func:`largest_remainder_counts` fit ``available`` (sequences per
    source), i.e. the biggest mixture with no repeated sequence.

    Largest-remainder counts are not monotone in N (Alabama paradox), so this searches down
    from the bound ``N < (available + 1) / w`` that every source must satisfy.
    """
    upper = min(
        min(math.floor((available[src] + 1) / w) for src, w in weights.items()),
        sum(available.values()),
    )
    for total in range(upper, 0, -1):
        counts = largest_remainder_counts(weights, total)
        if all(counts[src] <= available[src] for src in weights):
            return total
    return 0


def mixture_order(
    available: dict[str, int], counts: dict[str, int], seed: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Seeded choice and order of sequences.

    Returns:
        ``(picked, interleave)``: ``picked[src]`` is a 1-D int64 array of ``counts[src]``
        row indices into that source (a prefix of a seeded permutation); ``interleave`` is a
        permutation of ``sum(counts)`` positions of the concatenation (sorted source order).
    """
    rng = np.random.default_rng(seed)
    picked = {src: rng.permutation(available[src])[: counts[src]] for src in sorted(counts)}
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
    """Build and write the mixture (see the module docstring).

    Raises:
        pydantic.ValidationError: bad config (:class:`tidal.data.mix_config.MixConfig`).
        MixtureError: weights without input (or the reverse), inputs with different
            tokenizer hash / seq_len / dtype, more than 256 sources, ``n_sequences``
            larger than the sources can give without repetition, or an empty mixture.
    """
    cfg = MixConfig.model_validate(ctx.config)
    inputs = cfg.inputs
    metas = _check_inputs(ctx, cfg.weights, inputs)
    weights = normalize_weights(cfg.weights)
    if len(weights) > MAX_SOURCES:
        raise MixtureError(
            f"step {ctx.name}: {len(weights)} sources, at most {MAX_SOURCES} fit sources.npy (uint8)"
        )
    available = {src: int(meta["n_sequences"]) for src, meta in metas.items()}
    total = largest_feasible_total(weights, available) if cfg.n_sequences is None else cfg.n_sequences
    if total < 1:
        raise MixtureError(f"step {ctx.name}: empty mixture (available sequences {available})")
    counts = largest_remainder_counts(weights, total)
    short = {
        src: f"{counts[src]} > {available[src]}" for src in counts if counts[src] > available[src]
    }
    if short:
        raise MixtureError(
            f"step {ctx.name}: n_sequences {total} needs more sequences than available ({short}); "
            "lower n_sequences, change the weights or add data (sequences are never repeated)"
        )
    sources = sorted(weights)
    seq_len, tokenizer_hash = metas[sources[0]]["seq_len"], metas[sources[0]]["tokenizer_hash"]
    picked, interleave = mixture_order(available, counts, ctx.require_seed())
    blocks, labels = [], []
    for index, src in enumerate(sources):
        blocks.append(load_token_sequences(  # only the picked rows: range reads from a bucket
            ctx.input_files(inputs[src]), tokenizer_hash=tokenizer_hash, seq_len=seq_len, rows=picked[src]
        ))
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
    (ctx.out_dir / MIXTURE_FILE).write_text(json.dumps(mixture, indent=1, sort_keys=True) + "\n")
    return {
        "n_sequences": total,
        "n_tokens": total * seq_len,
        **{f"sequences/{s}": counts[s] for s in sources},
    }


if __name__ == "__main__":
    tidal.data.jobcli.main(sys.modules[__name__], "mix")
