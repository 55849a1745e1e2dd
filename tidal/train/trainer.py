"""The training loop: config, AdamW schedule, jitted step, eval, metrics, checkpoints, summary.

Invariant: the run is a pure function of ``spec.json`` (config, input bytes, seed). Parameters
are initialised from the step seed, batch ``i`` is ``BatchLoader.batch(i)``, and a resumed run
restores params and optimizer state from the newest verified checkpoint and continues at the
next step, so its parameters and losses are bitwise those of an uninterrupted run (on the
same backend). Step numbers in every output count *completed* optimizer updates (1..steps).

Files written in the step directory (besides ``checkpoints/``, see checkpoints.py):
``metrics.jsonl`` one JSON object per logged step; ``summary.json`` at the end.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tidal.train.checkpoints import Checkpointer, tree_sha256
from tidal.train.loader import BatchLoader, TokenShards, eval_sequences, read_tokenizer_meta
from tidal.train.model import (
    ModelConfig,
    flops_per_token,
    init_params,
    next_token_loss,
    param_count,
)

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
SPEC = "spec.json"


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

    @classmethod
    def from_config(cls, config: dict) -> TrainConfig:
        """Parse and check the step config.

        Raises:
            ConfigError: a missing/unknown key or bad value, naming the key and the rule.
        """
        ints = ("steps", "batch_size", "checkpoint_every", "eval_every", "eval_batches", "log_every",
                "keep_checkpoints")
        _check_keys(config, ints + ("model", "optimizer", "train_data", "tokenizer"), ("eval_data", "seed"), "")
        eval_data = config.get("eval_data") or {}
        if not isinstance(eval_data, dict) or not all(isinstance(v, str) for v in eval_data.values()):
            raise ConfigError(f"train config 'eval_data' must map source -> input step name, "
                              f"got {eval_data!r}")
        for key in ("train_data", "tokenizer"):
            if not isinstance(config[key], str):
                raise ConfigError(f"train config {key!r} must be an input step name, got {config[key]!r}")
        out = cls(model=dict(config["model"]), optimizer=OptimizerConfig.from_config(config["optimizer"]),
                  train_data=config["train_data"], eval_data=dict(eval_data), tokenizer=config["tokenizer"],
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


@dataclass
class Inputs:
    """The opened inputs of a train step: tokenizer metadata, train and eval token data."""

    tokenizer_meta: dict[str, Any]
    train: TokenShards
    evals: dict[str, TokenShards]


def open_inputs(cfg: TrainConfig, inputs: dict[str, str]) -> Inputs:
    """Open the tokenizer, train and eval directories named by ``cfg`` among ``inputs``.

    Raises:
        ConfigError: a named input step is not among ``inputs``.
        DataContractError: a tokenizer hash mismatch or malformed shard (from the loader).
    """
    def where(name: str) -> Path:
        if name not in inputs:
            raise ConfigError(f"train config names input step {name!r}, but the step's inputs are "
                              f"{sorted(inputs)}")
        return Path(inputs[name])

    tok_dir = where(cfg.tokenizer)
    meta = read_tokenizer_meta(tok_dir)
    train = TokenShards(where(cfg.train_data), tokenizer_hash=meta["tokenizer_hash"], tokenizer_dir=tok_dir)
    evals = {src: TokenShards(where(step), tokenizer_hash=meta["tokenizer_hash"], tokenizer_dir=tok_dir)
             for src, step in sorted(cfg.eval_data.items())}
    return Inputs(meta, train, evals)


def _seed32(seed: int, purpose: int) -> int:
    """A 31-bit int derived from the step seed for one purpose (0: parameter init)."""
    return int(np.random.SeedSequence([seed, purpose]).generate_state(1, dtype=np.uint32)[0] >> 1)


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _truncate_metrics(path: Path, last_step: int) -> list[dict[str, Any]]:
    """Keep only metric records with ``step <= last_step`` (steps about to be re-done go)."""
    kept = [r for r in _read_metrics(path) if r["step"] <= last_step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
    os.replace(tmp, path)
    return kept


def _eta(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def train(step_dir: str | Path, spec: dict[str, Any], *, stop_after: int | None = None,
          log: logging.Logger | None = None) -> dict[str, Any] | None:
    """Train (or resume training) as ``spec`` says, writing into ``step_dir``.

    Args:
        step_dir: output directory (holds ``spec.json``, checkpoints, metrics, summary).
        spec: ``{"config", "inputs": {name: dir}, "seed", ...}`` as written by ``tidal.train.run``.
        stop_after: testing aid that simulates preemption: return None right after completing
            this step (after its checkpoint, if one is due), without writing a summary.

    Returns:
        The summary (also written to ``summary.json``): ``steps``, ``tokens_seen`` (predicted
        token positions, ``steps * B * (S - 1)``), ``final_train_loss`` (nats/token),
        ``eval_loss`` (mean over sources) and ``eval_loss/<src>``, ``param_count``,
        ``flops_per_token``, ``checkpoint_step``, ``checkpoint_root_hash``, ``params_sha256``
        (:func:`tree_sha256` of the final parameters: equal across identical runs) and, when steps ran
        in this process, ``tokens_per_second`` after the first (compiling) step.

    Raises:
        ConfigError, DataContractError: bad config or inputs, before any training.
    """
    step_dir = Path(step_dir)
    log = log or logging.getLogger("tidal.train")
    cfg = TrainConfig.from_config(spec["config"])
    data = open_inputs(cfg, spec.get("inputs", {}))
    seed = int(spec.get("seed", 0))
    vocab = int(data.tokenizer_meta["vocab_size"])
    model_cfg = ModelConfig.from_config(cfg.model, vocab)
    seq_len = data.train.seq_len
    context = seq_len - 1
    tokens_per_step = cfg.batch_size * context
    loader = BatchLoader(data.train, cfg.batch_size, seed, vocab_size=vocab)
    eval_sets = {src: eval_sequences(shards, cfg.eval_batches, cfg.batch_size, vocab)
                 for src, shards in data.evals.items()}

    tx, schedule = make_optimizer(cfg.optimizer, cfg.steps)
    @jax.jit
    def init_state(key):
        params = init_params(model_cfg, key, context)
        return {"params": params, "opt_state": tx.init(params)}

    state = init_state(jax.random.key(_seed32(seed, 0)))
    n_params = param_count(model_cfg)

    ckpt = Checkpointer(step_dir, cfg.keep_checkpoints, log)
    restored = ckpt.restore_latest(state)
    start, manifest = 0, None
    if restored is not None:
        start, state, manifest = restored
        print(f"resumed from checkpoint step {start} ({ckpt.path(start)})", flush=True)
    metrics_path = step_dir / METRICS
    _truncate_metrics(metrics_path, start)

    @jax.jit
    def train_step(state, batch, index):
        loss, grads = jax.value_and_grad(lambda p: next_token_loss(p, model_cfg, batch))(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        stats = {"loss": loss, "grad_norm": optax.global_norm(grads), "lr": schedule(index)}
        return {"params": params, "opt_state": opt_state}, stats

    eval_loss_fn = jax.jit(lambda params, batch: next_token_loss(params, model_cfg, batch))

    def evaluate(params) -> dict[str, float]:
        out = {}
        for src, batches in eval_sets.items():
            total = sum(float(eval_loss_fn(params, jnp.asarray(b))) * b.shape[0] for b in batches)
            out[f"eval_loss/{src}"] = total / sum(b.shape[0] for b in batches)
        return out

    print(f"training {n_params:,} params, {cfg.steps} steps of {cfg.batch_size}x{seq_len} tokens "
          f"from step {start}", flush=True)
    last_eval: dict[str, float] = {}
    # step timing excludes compilation (the first step), evals and checkpoint saves
    mark_time, mark_step, first_step_s = time.perf_counter(), start, None
    timed_s, timed_steps = 0.0, 0
    with open(metrics_path, "a") as metrics_file:
        for i in range(start, cfg.steps):
            state, stats = train_step(state, jnp.asarray(loader.batch(i)), jnp.int32(i))
            done = i + 1
            if first_step_s is None:
                jax.block_until_ready(stats["loss"])
                now = time.perf_counter()
                first_step_s, mark_time, mark_step = now - mark_time, now, done
            is_last = done == cfg.steps
            eval_now = done % cfg.eval_every == 0 or is_last
            if done % cfg.log_every == 0 or eval_now:
                loss = float(stats["loss"])
                now = time.perf_counter()
                if done > mark_step:
                    step_s = (now - mark_time) / (done - mark_step)
                    timed_s, timed_steps = timed_s + now - mark_time, timed_steps + done - mark_step
                else:  # the first step of this process: its time is mostly compilation
                    step_s = first_step_s
                mark_time, mark_step = now, done
                record = {"step": done, "loss": loss, "lr": float(stats["lr"]),
                          "grad_norm": float(stats["grad_norm"]),
                          "tokens_per_second": tokens_per_step / step_s, "step_time_s": step_s}
                if eval_now:
                    last_eval = evaluate(state["params"])
                    record.update(last_eval)
                metrics_file.write(json.dumps(record, sort_keys=True) + "\n")
                metrics_file.flush()
                evals = " ".join(f"{k} {v:.4f}" for k, v in last_eval.items()) if eval_now else ""
                print(f"step {done}/{cfg.steps} loss {loss:.4f} lr {record['lr']:.2e} "
                      f"{record['tokens_per_second']:,.0f} tok/s {step_s * 1e3:.1f} ms/step "
                      f"eta {_eta(step_s * (cfg.steps - done))} {evals}".rstrip(), flush=True)
            if done % cfg.checkpoint_every == 0 or is_last:
                manifest = ckpt.save(done, state)
            if eval_now or done % cfg.checkpoint_every == 0:  # step times exclude eval and saving
                mark_time, mark_step = time.perf_counter(), done
            if stop_after is not None and done == stop_after:
                ckpt.close()
                print(f"stopped after step {done} (--stop-after)", flush=True)
                return None
    ckpt.close()
    if start == cfg.steps:  # nothing left to run: recompute the (deterministic) final eval
        last_eval = evaluate(state["params"])
    final = [r for r in _read_metrics(metrics_path) if r["step"] == cfg.steps]
    summary: dict[str, Any] = {
        "steps": cfg.steps, "tokens_seen": cfg.steps * tokens_per_step,
        "param_count": n_params, "flops_per_token": flops_per_token(model_cfg, context),
        "seq_len": seq_len, "batch_size": cfg.batch_size,
        "checkpoint_step": manifest["step"], "checkpoint_root_hash": manifest["root_hash"],
        "params_sha256": tree_sha256(state["params"]),
    }
    if final:
        summary["final_train_loss"] = final[-1]["loss"]
    if last_eval:
        summary["eval_loss"] = sum(last_eval.values()) / len(last_eval)
        summary.update(last_eval)
    if timed_steps:
        summary["tokens_per_second"] = tokens_per_step * timed_steps / timed_s
        summary["step_time_s"] = timed_s / timed_steps
    if first_step_s is not None:
        summary["compile_and_first_step_s"] = first_step_s
    tmp = step_dir / (SUMMARY + ".tmp")
    tmp.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, step_dir / SUMMARY)
    print(f"done: {json.dumps(summary, sort_keys=True)}", flush=True)
    return summary


def load_spec(step_dir: str | Path) -> dict[str, Any]:
    """Read ``STEP_DIR/spec.json``.

    Raises:
        ConfigError: missing or not a JSON object with a ``config`` mapping.
    """
    path = Path(step_dir) / SPEC
    try:
        spec = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the step spec ({err})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("config"), dict):
        raise ConfigError(f"{path}: expected an object with a 'config' mapping")
    return spec

