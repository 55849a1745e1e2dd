"""What a train step moves per chip, estimated from its shape and mesh when no compiled program says it: the
HBM bytes it reads and writes and the collectives it runs, in the compiled sizing's terms
(:mod:`tidal.train.aot`), so that an analytical sizing (a GPU, or a TPU without libtpu) predicts a step time
and an MFU by the same roofline (:attr:`tidal.train.sizing.Sizing.predicted`).

Per chip and step, with ``N`` parameters, ``m`` microbatches, mesh ``d x f x t``, ``P`` = 4 bytes (float32
parameters, gradients and AdamW moments), ``C`` the bytes of the compute dtype (``train.model.compute_dtype``)
and ``k`` the passes over the weights per microbatch (2: forward and backward; 3 with ``remat``, whose
backward pass runs the forward again):

* HBM: the weights read in each pass, ``k·m·N/t·C``; the activations written in the forward pass and read in
  the backward pass, ``2·m·A`` with ``A`` one microbatch's activations (:func:`tidal.train.memory.plan_memory`);
  the AdamW update reading parameters, gradients and both moments and writing parameters and moments,
  ``7·P·N/(f·t)``.
* all-gather (FSDP, ``f > 1``): each layer's weights gathered before each pass, ``k·m`` gathers of
  ``N/t·C`` bytes.
* reduce-scatter (``f > 1``): each microbatch's gradients back to their shards, ``m`` of ``N/t·P`` bytes.
* all-reduce: over ``data`` (``d > 1``) each microbatch's gradient shards, ``m`` of ``N/(f·t)·P`` bytes (the
  accumulating scan reduces inside its loop, as the reduce-scatter does); over ``tensor`` (``t > 1``) the
  attention and MLP outputs of every layer in each pass, ``(k+2)·L·m`` all-reduces of ``tokens·d_model·C``
  bytes (2 forward, 2 backward, 2 more for the recomputed forward; Megatron-LM, Shoeybi et al. 2019, §3).

The chip computes ``4/3`` of the model's FLOPs with ``remat`` (the forward again), which
:func:`hardware_flops` applies, so an analytical MFU stays below 75 % with recomputation.

Bytes on the wire are a ring's over each group of ``n`` chips, as :func:`tidal.train.aot.collectives` counts
them: ``(n-1)/n`` of the buffer for an all-gather or reduce-scatter, twice that for an all-reduce (Austin et
al. 2025, "How to Scale Your Model", part 3: the costs of collectives). What this leaves out (fused or
overlapped collectives, the compiler's own scratch) is why a compiled sizing replaces it wherever libtpu is
installed.
"""

from __future__ import annotations

from typing import Any

from tidal.train.flops import param_count
from tidal.train.memory import DTYPE_BYTES

PARAM_BYTES = 4


def _row(count: int, buffer: float, group: int, *, all_reduce: bool = False) -> dict[str, float]:
    share = (group - 1) / group * (2 if all_reduce else 1)
    return {"count": count, "buffer_bytes": count * buffer, "wire_bytes": count * buffer * share}


def traffic(model_cfg: Any, mesh: dict[str, int], *, microbatches: int, tokens_per_chip: int,
            activation_bytes: int) -> tuple[float, dict[str, dict[str, float]]]:
    """``(HBM bytes accessed, collectives)`` per chip and step by the formulas of the module docstring.

    Args:
        model_cfg: the :class:`tidal.train.flops.ModelShape`.
        mesh: ``{"data", "fsdp", "tensor"}`` sizes.
        microbatches: ``m``, parts of the batch computed one after another.
        tokens_per_chip: tokens of one microbatch on one chip (sequences per chip per microbatch x context).
        activation_bytes: one microbatch's activations on one chip (the memory plan's term).

    Returns:
        Bytes accessed, and ``{"all-gather" | "reduce-scatter" | "all-reduce": {"count", "buffer_bytes",
        "wire_bytes"}}`` for the kinds that occur.
    """
    n = param_count(model_cfg)
    c = DTYPE_BYTES[model_cfg.compute_dtype]
    k = 3 if model_cfg.remat else 2
    d, f, t, m = mesh["data"], mesh["fsdp"], mesh["tensor"], microbatches
    hbm = k * m * n / t * c + 2 * m * activation_bytes + 7 * PARAM_BYTES * n / (f * t)
    rows: dict[str, dict[str, float]] = {}
    if f > 1:
        rows["all-gather"] = _row(k * m, n / t * c, f)
        rows["reduce-scatter"] = _row(m, n / t * PARAM_BYTES, f)
    reduce = []
    if d > 1:
        reduce.append(_row(m, n / (f * t) * PARAM_BYTES, d, all_reduce=True))
    if t > 1:
        reduce.append(_row((k + 2) * model_cfg.n_layers * m, tokens_per_chip * model_cfg.d_model * c, t,
                           all_reduce=True))
    if reduce:
        rows["all-reduce"] = {key: sum(r[key] for r in reduce) for key in ("count", "buffer_bytes", "wire_bytes")}
    return hbm, rows


def hardware_flops(model_cfg: Any, model_flops: float) -> float:
    """The FLOPs the chips compute for ``model_flops`` of the model: ``4/3`` of them with ``remat`` (the forward
    pass, a third of a step's FLOPs, runs twice; Chen et al. 2016), else the same."""
    return model_flops * 4 / 3 if model_cfg.remat else model_flops
