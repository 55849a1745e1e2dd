"""The AdamW schedule the trainer (:mod:`tidal.train.build`), a trained model's restore
(:mod:`tidal.train.trained`) and the throughput bench's hand-written loop share.

Apart from :mod:`tidal.train.config` so that the config module, which the recipe and the planner
import, reaches no JAX or optax, not even through a lazy import.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from tidal.train.config import OptimizerConfig, wsd_decay_steps


def wsd_schedule(cfg: OptimizerConfig, decay_start: int, decay_steps: int) -> Callable:
    """The warmup-stable-decay learning rate of 0-based update ``i``: linear warmup from 0 to ``lr`` over
    ``warmup_steps``, ``lr`` until ``decay_start``, then from ``lr`` to ``lr * min_lr_ratio`` over
    ``decay_steps`` updates with ``decay_shape`` (linear ``1 - t``, cosine ``(1 + cos(pi t)) / 2``, 1-sqrt
    ``1 - sqrt(t)``, Hägele et al. 2024, for ``t`` in [0, 1]); ``lr * min_lr_ratio`` after.

    One function for a straight WSD run and for a decay branch (``decay_start`` = the branch's checkpoint
    step), so a branch's learning rates are bitwise those of the run that decays there.
    """
    peak, end = cfg.lr, cfg.lr * cfg.min_lr_ratio
    warmup = cfg.warmup_steps

    def schedule(i):
        i = jnp.asarray(i, jnp.float32)
        warm = peak * i / warmup if warmup else jnp.float32(peak)
        t = jnp.clip((i - decay_start) / decay_steps, 0.0, 1.0)
        if cfg.decay_shape == "linear":
            fall = 1.0 - t
        elif cfg.decay_shape == "cosine":
            fall = 0.5 * (1.0 + jnp.cos(jnp.pi * t))
        else:
            fall = 1.0 - jnp.sqrt(t)
        decayed = end + (peak - end) * fall
        return jnp.where(i < warmup, warm, jnp.where(i < decay_start, peak, decayed))

    return schedule


def make_optimizer(cfg: OptimizerConfig, total_steps: int,
                   decay_start: int | None = None) -> tuple[optax.GradientTransformation, Callable]:
    """Clip-by-global-norm then AdamW on the config's schedule.

    ``cosine``: ``optax.warmup_cosine_decay_schedule``, rising linearly from 0 to ``lr`` over
    ``warmup_steps`` and falling by a cosine to ``lr * min_lr_ratio`` at ``total_steps`` (optax's
    ``decay_steps`` includes the warmup). ``wsd``: :func:`wsd_schedule`, decaying over the last
    ``decay_fraction`` of ``total_steps``, or from ``decay_start`` to ``total_steps`` when given (a decay
    branch). The schedule reads the update count kept in the optimizer state, so a restored state continues it.

    Returns:
        ``(transformation, schedule)``; ``schedule(i)`` is the learning rate of 0-based update i.
    """
    if cfg.schedule == "wsd":
        if decay_start is None:
            decay_start = total_steps - wsd_decay_steps(cfg.decay_fraction, total_steps)
        schedule = wsd_schedule(cfg, decay_start, max(total_steps - decay_start, 1))
    else:
        schedule = optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps, decay_steps=total_steps,
            end_value=cfg.lr * cfg.min_lr_ratio)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask)
    parts = ([optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []) + [adamw]
    return optax.chain(*parts), schedule


__all__ = ["make_optimizer", "wsd_schedule"]
