"""What a training spec builds: its inputs (token shards, tokenizer meta, held-out sources), the
model and optimizer, the mesh and the jitted step (:class:`Run`), and the held-out evaluation.

Everything here is a pure function of ``spec.json`` (config, input bytes, seed): the training
loop (:mod:`tidal.train.trainer`) and the profiler (:mod:`tidal.train.profile`) both start from
:func:`build`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from tidal.data.heldout import EVAL_PREFIX, HELDOUT_PREFIX
from tidal.files.step_files import StepFiles
from tidal.storage.layout import SPEC_JSON as SPEC
from tidal.train import distributed
from tidal.train import mesh as meshlib
from tidal.train import model as modellib
from tidal.train.config import ConfigError, TrainStepConfig
from tidal.train.distributed import host_scalar
from tidal.train.loader import (
    BatchLoader,
    TokenShards,
    eval_sequences,
    read_tokenizer_meta,
    token_byte_lengths,
)
from tidal.train.metrics import model_flops_utilisation, peak_flops
from tidal.train.mixed import MixedShards, is_load_time
from tidal.train.model import ModelShape, init_params
from tidal.train.optimizer import make_optimizer


@dataclass
class Inputs:
    """The opened inputs of a train step: tokenizer metadata, train and eval token data."""

    tokenizer_meta: dict[str, Any]
    train: TokenShards | MixedShards
    evals: dict[str, TokenShards]
    token_bytes: np.ndarray | None = None


def open_inputs(cfg: TrainStepConfig, inputs: dict[str, str]) -> Inputs:
    """Open the tokenizer, train and eval steps named by ``cfg`` among ``inputs`` (step name ->
    directory or bucket URI, as ``spec.json`` records them; ``heldout_data`` steps give the eval sets
    ``heldout/<source>``, their held-out split; a load-time mixture's sources: :mod:`tidal.train.mixed`),
    in place: from a bucket only the metadata, the ``.npy`` headers and ``tokenizer.json`` are read here,
    token rows per batch.

    Raises:
        ConfigError: a named input step is not among ``inputs``.
        DataContractError: a tokenizer hash mismatch or malformed shard (from the loader).
    """
    def where(name: str) -> StepFiles:
        if name not in inputs:
            raise ConfigError(f"train config names input step {name!r}, but the step's inputs are "
                              f"{sorted(inputs)}")
        return StepFiles.open(inputs[name])  # a directory or a bucket URI: read in place

    tok = where(cfg.tokenizer)
    meta = read_tokenizer_meta(tok)
    mix = where(cfg.train_data)
    train = (MixedShards(mix, where, tokenizer_hash=meta["tokenizer_hash"], tokenizer_dir=tok.uri) if is_load_time(mix)
             else TokenShards(mix, tokenizer_hash=meta["tokenizer_hash"], tokenizer_dir=tok.uri))
    evals = {src: TokenShards(where(step), tokenizer_hash=meta["tokenizer_hash"], tokenizer_dir=tok.uri)
             for src, step in sorted(cfg.eval_data.items())}
    evals |= {f"{EVAL_PREFIX}{src}": TokenShards(where(step), tokenizer_hash=meta["tokenizer_hash"],
                                                 tokenizer_dir=tok.uri, prefix=HELDOUT_PREFIX)
              for src, step in sorted(cfg.heldout_data.items())}
    return Inputs(meta, train, evals, token_byte_lengths(tok, int(meta["vocab_size"]), meta["tokenizer_hash"]))


def _seed32(seed: int, purpose: int) -> int:
    """A 31-bit int derived from the step seed for one purpose (0: parameter init)."""
    return int(np.random.SeedSequence([seed, purpose]).generate_state(1, dtype=np.uint32)[0] >> 1)


@dataclass
class Run:
    """Everything built from a spec before the first step (shared by training and profiling)."""

    cfg: TrainStepConfig
    data: Inputs
    seed: int
    model_cfg: ModelShape
    seq_len: int
    loader: BatchLoader
    eval_sets: dict[str, list[np.ndarray]]
    mesh: Any
    shardings: Any
    abstract: Any
    init: Callable
    key: Any
    step: Callable
    eval_loss: dict[tuple[int, ...], tuple[Any, Any]]  # batch shape -> (layout, compiled mean CE)
    schedule: Callable
    peak: float | None
    optimizer: Any = None  # the optax transformation (its init: a rewarmed continuation's fresh state)

    @property
    def context(self) -> int:
        """Predicted positions per sequence, ``S - 1`` tokens (the model's input length)."""
        return self.seq_len - 1

    @property
    def tokens_per_step(self) -> int:
        """Predicted tokens per optimizer update, ``B * (S - 1)``."""
        return self.cfg.batch_size * self.context

    def batch(self, step: int) -> jax.Array:
        """Global batch of 0-based ``step``, laid out over ``data x fsdp``; each process reads only
        its own rows of it (:func:`tidal.train.mesh.process_rows`)."""
        return meshlib.put_global(self.loader.batch(step), meshlib.batch_sharding(self.mesh), self.cfg.batch_size)

    def fresh_state(self) -> Any:
        """Initial ``{"params", "opt_state"}`` from the step seed, already sharded."""
        return jax.jit(self.init, out_shardings=self.shardings)(self.key)

    def fresh_opt_state(self, params: Any) -> Any:
        """A fresh optimizer state (zero moments, update count 0) for ``params``, sharded."""
        return jax.jit(self.optimizer.init, out_shardings=self.shardings["opt_state"])(params)

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilisation of ``tokens_per_s`` (None without a known device peak)."""
        return model_flops_utilisation(tokens_per_s, self.model_cfg, self.context, self.peak)


def _loss_parts(model_cfg: ModelShape) -> Callable:
    """``loss_parts(params, batch) -> (loss, parts)``: the training loss and, for MoE models, its parts
    (cross-entropy, load-balancing and z losses, dropped fraction); otherwise ``{"ce": ...}``."""
    with_parts = getattr(modellib, "loss_and_metrics", None)
    moe = bool(getattr(model_cfg, "n_moe_layers", 0))

    def loss_parts(params, batch):
        if with_parts is None:
            return modellib.next_token_loss(params, model_cfg, batch), {}
        loss, parts = with_parts(params, model_cfg, batch)
        return loss, (dict(parts) if moe else {"ce": parts["ce"]})

    return loss_parts


def accumulated_value_and_grad(value_and_grad: Callable, microbatches: int) -> Callable:
    """``value_and_grad(params, batch)`` over ``microbatches`` equal parts of ``batch`` accumulated in a
    ``lax.scan``: the mean of their losses, parts and gradients, which is the whole batch's (every sequence
    has the same number of predicted tokens, so the mean of the parts' means is the batch's mean), with the
    activations of one part alive at a time. An MoE model's load-balancing loss is a product of two batch
    means (Switch eq. 4): its mean over the parts is not the whole batch's, so there the update differs by
    that term. Part ``j`` holds rows ``j, j + m, j + 2m, ...``: with the batch
    sharded over ``data x fsdp`` in contiguous blocks, every device keeps its own rows (no resharding) when
    ``batch_size / microbatches`` divides over them (:func:`tidal.train.build.build` checks it)."""
    if microbatches == 1:
        return value_and_grad
    import jax.numpy as jnp

    def accumulated(params, batch):
        parts = batch.reshape(batch.shape[0] // microbatches, microbatches, batch.shape[1]).swapaxes(0, 1)
        shapes = jax.eval_shape(value_and_grad, params, parts[0])
        zeros = jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes)

        def add(total, part):
            return jax.tree.map(jnp.add, total, value_and_grad(params, part)), None

        total, _ = jax.lax.scan(add, zeros, parts)
        return jax.tree.map(lambda leaf: leaf / microbatches, total)

    return accumulated


def train_functions(cfg: TrainStepConfig, model_cfg: ModelShape, context: int) -> tuple[Callable, Callable, Any,
                                                                                      Callable]:
    """The pure functions of one training run, before any mesh or data: ``(init, step_fn, tx, schedule)``.

    ``init(key) -> {"params", "opt_state"}``; ``step_fn(state, batch, index) -> (state, stats)`` with
    ``batch`` int32 ``[B, S]`` token ids (``S = context + 1``) and stats ``loss``, ``grad_norm``, ``lr``
    (and the MoE loss parts); ``tx`` the optax transformation; ``schedule(index)`` the learning rate.
    A continued run's schedule follows ``cfg.continue_from`` (a rewarm restarts it over the new updates;
    a decay branch decays from the parent's step). Shared by :func:`build` (training and profiling) and
    the ahead-of-time sizer (:mod:`tidal.train.aot`), so what is sized is what trains.
    """
    ref = cfg.continue_from
    if ref is not None and ref.schedule == "rewarm":  # a new schedule over the new updates, fresh Adam state
        tx, new_schedule = make_optimizer(cfg.optimizer, cfg.steps - ref.checkpoint_step)
        schedule = lambda index: new_schedule(index - ref.checkpoint_step)
    elif ref is not None and ref.schedule == "decay":  # a WSD trunk's decay branch: decay from its checkpoint on
        tx, schedule = make_optimizer(cfg.optimizer, cfg.steps, decay_start=ref.checkpoint_step)
    else:
        tx, schedule = make_optimizer(cfg.optimizer, cfg.steps)
    loss_parts = _loss_parts(model_cfg)
    moe = bool(getattr(model_cfg, "n_moe_layers", 0))

    def init(key):
        params = init_params(model_cfg, key, context)
        return {"params": params, "opt_state": tx.init(params)}

    grads_of = accumulated_value_and_grad(jax.value_and_grad(loss_parts, has_aux=True), cfg.microbatches)

    def step_fn(state, batch, index):
        (loss, parts), grads = grads_of(state["params"], batch)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        stats = {"loss": loss, "grad_norm": optax.global_norm(grads), "lr": schedule(index)}
        if moe:  # cross-entropy, load-balancing and z losses, dropped fraction
            stats |= parts
        return {"params": params, "opt_state": opt_state}, stats

    return init, step_fn, tx, schedule


def step_seed(spec: dict[str, Any], where: str | Path = SPEC) -> int:
    """The step seed of ``spec``: derived by the runner from the recipe seed and the step name,
    written by :func:`tidal.train.write_spec`. Never defaulted: a missing seed would silently
    give every run the same parameters and batch order.

    Raises:
        ConfigError: ``seed`` missing or not a non-negative int; names ``where`` and the field.
    """
    if spec.get("seed") is None:
        raise ConfigError(f"{where}: missing field 'seed' (the step seed, written by tidal.train.write_spec "
                          f"from the step context); the trainer does not default it")
    seed = spec["seed"]
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"{where}: field 'seed' must be a non-negative int, got {seed!r}")
    return seed


def build(spec: dict[str, Any], where: str | Path = SPEC) -> Run:
    """Open the spec's inputs, make the mesh and jit the step functions.

    Args:
        spec: the step spec (``spec.json``): ``config`` (its :class:`TrainStepConfig`, parsed once by
            :func:`tidal.train.trainer.load_spec`), ``inputs``, ``seed``.
        where: the spec's file, named by error messages.

    Raises:
        ConfigError, DataContractError: bad config or inputs, before any training.
        TypeError: ``config`` is not the parsed model (a caller bug).
    """
    distributed.start_once()
    seed = step_seed(spec, where)  # split once below: parameter init (_seed32 purpose 0), batch order
    cfg = spec["config"]  # parsed once, by load_spec (or handed over by the in-process caller)
    if not isinstance(cfg, TrainStepConfig):
        raise TypeError(f"{where}: spec['config'] must be the parsed TrainStepConfig (tidal.train.trainer.load_spec), "
                        f"got {type(cfg).__name__}")
    data = open_inputs(cfg, spec.get("inputs", {}))
    vocab = int(data.tokenizer_meta["vocab_size"])
    try:
        model_cfg = cfg.model.shape(vocab)
        requested = None if cfg.mesh is None else cfg.mesh.model_dump()
        sizes = meshlib.mesh_shape(jax.device_count(), requested, meshlib.slice_count())
        mesh = meshlib.make_mesh(sizes)
        meshlib.check_batch(cfg.batch_size, mesh)
        meshlib.check_batch(cfg.batch_size // cfg.microbatches, mesh)  # each microbatch over every device
    except ValueError as err:  # a vocabulary size pydantic refuses, MeshError
        raise ConfigError(f"{where}: {err}") from None
    seq_len = data.train.seq_len
    context = seq_len - 1
    rows = meshlib.process_rows(meshlib.batch_sharding(mesh), cfg.batch_size)  # this host's rows of each batch
    ref = cfg.continue_from  # a continued run reads the parent's batch order on (tidal/train/continuation.py)
    blocks = cfg.block_reads
    try:
        loader = BatchLoader(data.train, cfg.batch_size, seed if ref is None else ref.data_seed, vocab_size=vocab,
                             rows=rows, block_reads=None if blocks is None else (blocks.block_bytes,
                                                                                 blocks.window_blocks))
    except ValueError as err:  # block reads of a mixture smaller than one batch
        raise ConfigError(f"{where}: train.block_reads: {err}") from None
    if jax.process_count() > 1:
        print(f"process {jax.process_index()} of {jax.process_count()} reads rows {rows.start}:{rows.stop} "
              f"of each batch of {cfg.batch_size}", flush=True)
    # the same eval_batches * batch_size sequences, a microbatch's rows at a time: what fits a step fits an eval
    eval_rows = cfg.batch_size // cfg.microbatches
    eval_sets = {src: eval_sequences(shards, cfg.eval_batches * cfg.microbatches, eval_rows, vocab)
                 for src, shards in data.evals.items()}
    init, step_fn, tx, schedule = train_functions(cfg, model_cfg, context)
    key = jax.random.key(_seed32(seed, 0))
    abstract = jax.eval_shape(init, key)
    heads = (model_cfg.n_heads, model_cfg.kv_heads)
    shardings = meshlib.state_shardings(abstract, mesh, heads)
    replicated = meshlib.replicated(mesh)
    loss_parts = _loss_parts(model_cfg)
    # Donating the old state halves state memory on GPU/TPU; on CPU a checkpoint's host copy may
    # alias the device buffer, so the CPU step keeps its input.
    donate = (0,) if jax.default_backend() != "cpu" else ()
    if cfg.divergence is None:
        step = jax.jit(step_fn, in_shardings=(shardings, meshlib.batch_sharding(mesh), None),
                       out_shardings=(shardings, replicated), donate_argnums=donate)
    else:
        step = _guarded_step(step_fn, cfg.divergence.action == "skip", shardings, meshlib.batch_sharding(mesh),
                             replicated, donate)
    eval_jit = jax.jit(lambda params, batch: loss_parts(params, batch)[1]["ce"], out_shardings=replicated)
    # compiled ahead of time, once per eval batch shape, so no compilation lands inside the loop
    params_abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                   abstract["params"], shardings["params"])
    rows_per_shard = mesh.shape["data"] * mesh.shape["fsdp"]
    eval_loss: dict[tuple[int, ...], tuple[Any, Any]] = {}
    for batches in eval_sets.values():
        for b in batches:
            if b.shape not in eval_loss:
                layout = meshlib.batch_sharding(mesh) if b.shape[0] % rows_per_shard == 0 else replicated
                eval_loss[b.shape] = (layout, eval_jit.lower(
                    params_abstract, jax.ShapeDtypeStruct(b.shape, b.dtype, sharding=layout)).compile())
    kind = jax.devices()[0].device_kind
    return Run(cfg, data, seed, model_cfg, seq_len, loader, eval_sets, mesh, shardings, abstract, init, key,
               step, eval_loss, schedule, peak_flops(kind, jax.device_count()), tx)


NO_CEILING = np.float32(np.inf)


def guarded_step_fn(step_fn: Callable, skip: bool) -> Callable:
    """The step of a run with a divergence guard (:mod:`tidal.train.divergence`), unjitted:
    ``guarded(state, batch, index, ceiling)``; with ``skip`` it keeps the old state when the loss or the
    gradient norm is not finite or the loss is above ``ceiling`` (decided on the device, so the parameters
    never hold that update). The sizer (:mod:`tidal.train.aot`) compiles this same function."""
    import jax.numpy as jnp

    def guarded(state, batch, index, ceiling):
        new_state, stats = step_fn(state, batch, index)
        if skip:
            ok = jnp.isfinite(stats["loss"]) & jnp.isfinite(stats["grad_norm"]) & (stats["loss"] <= ceiling)
            new_state = jax.tree.map(lambda new, old: jnp.where(ok, new, old), new_state, state)
        return new_state, stats

    return guarded


def _guarded_step(step_fn: Callable, skip: bool, shardings: Any, batch_layout: Any, replicated: Any,
                  donate: tuple[int, ...]) -> Callable:
    """:func:`guarded_step_fn` jitted; its fourth argument (the loss ceiling) defaults to inf."""
    jitted = jax.jit(guarded_step_fn(step_fn, skip), in_shardings=(shardings, batch_layout, None, None),
                     out_shardings=(shardings, replicated), donate_argnums=donate)
    return lambda state, batch, index, ceiling=NO_CEILING: jitted(state, batch, index, ceiling)


def evaluate(run: Run, params: Any) -> dict[str, float]:
    """Held-out loss and bits per byte of every eval source.

    ``eval_loss/<src>``: mean next-token cross-entropy over every predicted position of the
    fixed eval sequences (nats/token). ``eval_bpb/<src>`` (when the tokenizer's
    ``tokenizer.json`` is present): ``total nats / ln 2 / total UTF-8 bytes`` of the predicted
    tokens (targets ``batch[:, 1:]``), the bytes of each token taken from the tokenizer
    (:func:`tidal.train.loader.token_byte_lengths`; end-of-document tokens are 0 bytes).
    """
    out: dict[str, float] = {}
    for src, batches in run.eval_sets.items():
        total = 0.0
        for b in batches:
            layout, mean_ce = run.eval_loss[b.shape]
            total += host_scalar(mean_ce(params, meshlib.put_global(b, layout))) * b.shape[0]
        rows = sum(b.shape[0] for b in batches)
        out[f"eval_loss/{src}"] = total / rows
        if run.data.token_bytes is not None:
            n_bytes = int(sum(run.data.token_bytes[b[:, 1:]].sum() for b in batches))
            if n_bytes:
                out[f"eval_bpb/{src}"] = total * (run.seq_len - 1) / math.log(2) / n_bytes
    return out
