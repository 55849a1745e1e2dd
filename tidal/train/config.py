"""Train step configuration: the validated ``train`` config and the AdamW schedule.

:class:`TrainConfig` (and its :class:`OptimizerConfig`) check a train step's config with
errors naming the key and the rule; :func:`make_optimizer` builds the optimizer the trainer
(:mod:`tidal.train.trainer`) and the throughput bench's hand-written loop both use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import jax
import optax

from tidal.train import mesh as meshlib


class ConfigError(ValueError):
    """The train step's config breaks a rule; the message names the key."""


def _positive_int(config: dict, key: str, allow_zero: bool = False) -> int:
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if allow_zero else 1):
        raise ConfigError(f"train config {key!r} must be a {'non-negative' if allow_zero else 'positive'} "
                          f"int, got {value!r}")
    return value


def _number(config: dict, key: str, low: float, high: float, prefix: str = "optimizer.") -> float:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ConfigError(f"train config '{prefix}{key}' must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _check_keys(config: dict, required: tuple[str, ...], optional: tuple[str, ...], where: str) -> None:
    if not isinstance(config, dict):
        raise ConfigError(f"train config {where}: expected a mapping, got {type(config).__name__}")
    missing = [k for k in required if k not in config]
    unknown = sorted(set(config) - set(required) - set(optional))
    if missing or unknown:
        raise ConfigError(f"train config {where}: missing keys {missing}, unknown keys {unknown}")


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with linear warmup then cosine decay, and global-norm gradient clipping.

    Attributes:
        lr: peak learning rate (reached after ``warmup_steps``).
        min_lr_ratio: final learning rate as a fraction of ``lr`` (cosine end value).
        warmup_steps: steps of linear warmup from 0.
        weight_decay: decoupled weight decay (Loshchilov & Hutter 2019), applied to matrices
            only (params with ndim >= 2), not to RMSNorm scales.
        b1, b2: Adam moment decay rates.
        grad_clip: max global gradient norm; 0 disables clipping.
    """

    lr: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    b1: float
    b2: float
    grad_clip: float

    @classmethod
    def from_config(cls, config: dict) -> OptimizerConfig:
        """Parse ``config["optimizer"]``.

        Raises:
            ConfigError: a missing/unknown key or out-of-range value, naming it.
        """
        names = tuple(f.name for f in fields(cls))
        _check_keys(config, names, (), "'optimizer'")
        return cls(lr=_number(config, "lr", 0.0, 10.0),
                   min_lr_ratio=_number(config, "min_lr_ratio", 0.0, 1.0),
                   warmup_steps=_positive_int(config, "warmup_steps", allow_zero=True),
                   weight_decay=_number(config, "weight_decay", 0.0, 10.0),
                   b1=_number(config, "b1", 0.0, 1.0), b2=_number(config, "b2", 0.0, 1.0),
                   grad_clip=_number(config, "grad_clip", 0.0, math.inf))


@dataclass(frozen=True)
class TrainConfig:
    """The train step's config (``ctx.config``); see docs/contracts.md, kind ``train``.

    Attributes:
        model: ``{d_model, n_layers, n_heads, d_ff}`` (checked by ``ModelConfig.from_config``).
        optimizer: see :class:`OptimizerConfig`.
        steps: optimizer updates to run.
        batch_size: sequences per update.
        checkpoint_every, eval_every, log_every: intervals in steps (the last step always
            checkpoints, evaluates and logs).
        eval_batches: batches of ``batch_size`` sequences per eval source.
        keep_checkpoints: newest checkpoints kept on disk.
        train_data: input step name of the mixture.
        eval_data: eval source name -> input step name of its tokenized data.
        tokenizer: input step name of the tokenizer.
        mesh: explicit mesh axis sizes ``{data, fsdp, tensor}`` (None or missing: derived,
            see :func:`tidal.train.mesh.mesh_shape`).
        checkpoint_permanent_every: also keep every checkpoint whose step is a multiple of
            this, forever (None: only the newest ``keep_checkpoints``).
    """

    model: dict[str, Any]
    optimizer: OptimizerConfig
    steps: int
    batch_size: int
    checkpoint_every: int
    eval_every: int
    eval_batches: int
    log_every: int
    keep_checkpoints: int
    train_data: str
    eval_data: dict[str, str]
    tokenizer: str
    mesh: dict[str, int | None] | None = None
    checkpoint_permanent_every: int | None = None

    @classmethod
    def from_config(cls, config: dict) -> TrainConfig:
        """Parse and check the step config.

        Raises:
            ConfigError: a missing/unknown key or bad value, naming the key and the rule.
        """
        ints = ("steps", "batch_size", "checkpoint_every", "eval_every", "eval_batches", "log_every",
                "keep_checkpoints")
        _check_keys(config, ints + ("model", "optimizer", "train_data", "tokenizer"),
                    ("eval_data", "seed", "mesh", "checkpoint_permanent_every"), "")
        eval_data = config.get("eval_data") or {}
        if not isinstance(eval_data, dict) or not all(isinstance(v, str) for v in eval_data.values()):
            raise ConfigError(f"train config 'eval_data' must map source -> input step name, "
                              f"got {eval_data!r}")
        for key in ("train_data", "tokenizer"):
            if not isinstance(config[key], str):
                raise ConfigError(f"train config {key!r} must be an input step name, got {config[key]!r}")
        mesh = config.get("mesh")
        try:
            meshlib.check_request(mesh)
        except meshlib.MeshError as err:
            raise ConfigError(str(err)) from None
        permanent = config.get("checkpoint_permanent_every")
        if permanent is not None:
            permanent = _positive_int(config, "checkpoint_permanent_every")
        out = cls(model=dict(config["model"]), optimizer=OptimizerConfig.from_config(config["optimizer"]),
                  train_data=config["train_data"], eval_data=dict(eval_data), tokenizer=config["tokenizer"],
                  mesh=None if mesh is None else dict(mesh), checkpoint_permanent_every=permanent,
                  **{k: _positive_int(config, k) for k in ints})
        if out.optimizer.warmup_steps >= out.steps:
            raise ConfigError(f"train config 'optimizer.warmup_steps' ({out.optimizer.warmup_steps}) must be "
                              f"below 'steps' ({out.steps})")
        return out


def make_optimizer(cfg: OptimizerConfig, total_steps: int) -> tuple[optax.GradientTransformation, Callable]:
    """Clip-by-global-norm then AdamW on ``optax.warmup_cosine_decay_schedule``.

    The schedule rises linearly from 0 to ``lr`` over ``warmup_steps`` and decays by a cosine to
    ``lr * min_lr_ratio`` at ``total_steps`` (optax's ``decay_steps`` includes the warmup).

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
