"""The AdamW schedule the trainer (:mod:`tidal.train.build`), a trained model's restore
(:mod:`tidal.train.trained`) and the throughput bench's hand-written loop share.

Apart from :mod:`tidal.train.config` so that the config module, which the recipe and the planner
import, reaches no JAX or optax, not even through a lazy import.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import optax

from tidal.train.config import OptimizerConfig


def make_optimizer(cfg: OptimizerConfig, total_steps: int) -> tuple[optax.GradientTransformation, Callable]:
    """Clip-by-global-norm then AdamW on ``optax.warmup_cosine_decay_schedule``.

    The schedule rises linearly from 0 to ``lr`` over ``warmup_steps`` and decays by a cosine to
    ``lr * min_lr_ratio`` at ``total_steps`` (optax's ``decay_steps`` includes the warmup). The
    schedule reads the update count kept in the optimizer state, so a restored state continues it.

    Returns:
        ``(transformation, schedule)``; ``schedule(i)`` is the learning rate of 0-based update i.
    """
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=cfg.warmup_steps, decay_steps=total_steps,
        end_value=cfg.lr * cfg.min_lr_ratio)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    adamw = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask)
    parts = ([optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []) + [adamw]
    return optax.chain(*parts), schedule


__all__ = ["make_optimizer"]
