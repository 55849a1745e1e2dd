"""Train step configuration: the one schema of a training run.

Invariant: a training config is typed once. :class:`TrainConfig` (with :class:`OptimizerConfig`,
:class:`MeshConfig` and :class:`tidal.train.flops.ModelConfig`) is what a recipe's ``train``
section says (``tidal.recipe.training`` composes it, adding only ``resources``); the planner
hashes its ``model_dump``, so that dump must stay byte-identical for existing recipes (unset
optional fields are left out). :class:`TrainStepConfig` is the step config the planner writes,
the same fields plus the input step names; it crosses to a training process as its JSON data in
``spec.json`` and is parsed there once (:func:`parse_step_config`, called by
:func:`tidal.train.trainer.load_spec`, turns a refusal into a :class:`ConfigError` naming the dotted
field). The AdamW schedule it describes is built by :func:`tidal.train.optimizer.make_optimizer`.

Light on purpose: no JAX or optax, not even through a lazy import (recipe validation, planning and
DAG parsing import this).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_serializer, model_validator
from pydantic import Strict as StrictType

from tidal.config import Fraction, PositiveInt, Strict, omit_unused, problems
from tidal.storage.layout import SPEC_JSON
from tidal.train.flops import ModelConfig

NonNegativeInt = Annotated[int, StrictType(), Field(ge=0)]
InputStep = Annotated[str, StrictType(), Field(min_length=1)]
# a step id as tidal.steps derives it: ``{name}-{12 hex}``
StepId = Annotated[str, StrictType(), Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*-[0-9a-f]{12}$")]
Sha256Hex = Annotated[str, StrictType(), Field(pattern=r"^[0-9a-f]{64}$")]
CONTINUE_INPUT = "continue-from"  # the input step name of the train step a continued run starts from


class ConfigError(ValueError):
    """The train step's config breaks a rule; the message names the key."""


class OptimizerConfig(Strict):
    """AdamW with linear warmup then a decay, and global-norm gradient clipping.

    Schedules: ``cosine`` (the default) decays by a cosine from the end of warmup to the last step
    (Loshchilov & Hutter 2019); ``wsd`` (warmup-stable-decay) holds the peak learning rate, then decays
    over the last ``decay_fraction`` of the steps with ``decay_shape`` (Hu et al. 2024, MiniCPM; Hägele et al.
    2024 for 1-sqrt; Delphi's recipe: 10 % warmup, 20 % linear decay to 0, i.e. ``min_lr_ratio: 0``). A WSD
    trunk can be branched into its decay at any checkpoint of its stable phase (``continue_from`` with
    ``schedule: decay``), bitwise the run that decays there.
    """

    lr: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        default=3e-3, description="peak learning rate, reached after warmup_steps")
    min_lr_ratio: Fraction = Field(default=0.1, description="final learning rate as a fraction of lr (decay end)")
    warmup_steps: NonNegativeInt = Field(default=20, description="steps of linear warmup from 0; below steps")
    schedule: Literal["cosine", "wsd"] = Field(
        default="cosine", description="cosine: decay from the end of warmup to the last step; wsd: warmup, "
        "stable at lr, then decay over the last decay_fraction of the steps")
    decay_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = Field(
        default=0.2, description="wsd: the fraction of all steps spent decaying (Delphi: 0.2); rounded to steps")
    decay_shape: Literal["linear", "cosine", "1-sqrt"] = Field(
        default="linear", description="wsd: how the decay falls from lr to lr * min_lr_ratio (1-sqrt: "
        "Hägele et al. 2024)")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # the cosine default keeps every existing train step id: the WSD fields enter a config only with wsd
        data = handler(self)
        if data.get("schedule") == "cosine":
            data = omit_unused(data, {"schedule": "cosine", "decay_fraction": 0.2, "decay_shape": "linear"})
        return data
    weight_decay: Annotated[float, Field(ge=0.0)] = Field(
        default=0.1, description="decoupled weight decay, on matrices only (params with ndim >= 2), not norms")
    b1: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(default=0.9, description="Adam first-moment decay")
    b2: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(default=0.95, description="Adam second-moment decay")
    grad_clip: Annotated[float, Field(gt=0.0)] = Field(default=1.0, description="max global gradient norm")


class MeshConfig(Strict):
    """Explicit device-mesh axis sizes (:mod:`tidal.train.mesh`); an axis left null is derived:
    tensor 1, data = TPU slices, fsdp = the remaining devices. Hashed: another mesh changes
    the order of floating-point reductions, hence the loss bits."""

    data: PositiveInt | None = Field(default=None, description="pure data-parallel replicas")
    fsdp: PositiveInt | None = Field(default=None, description="devices sharing params/optimizer state (FSDP)")
    tensor: PositiveInt | None = Field(default=None, description="tensor-parallel devices (heads, d_ff)")


class DivergenceConfig(Strict):
    """The divergence guard (:mod:`tidal.train.divergence`): what a non-finite loss or gradient norm,
    or a loss spike, does to the run. Hashed (``skip`` changes the trajectory when it fires)."""

    action: Literal["fail", "skip", "rerun"] = Field(
        default="fail", description="fail: stop with an error; skip: drop that update; rerun: restore the last "
        "checkpoint and redo the steps (a spike that repeats on a deterministic trainer points at the data or "
        "the model, one that does not at the hardware)")
    spike_factor: Annotated[float, Field(gt=1.0)] = Field(
        default=10.0, description="a loss above this multiple of the running median of the accepted losses is a spike")
    window: PositiveInt = Field(default=100, description="accepted losses in the running median")
    min_history: PositiveInt = Field(default=20, description="accepted losses needed before spikes are judged")
    max_reruns: PositiveInt = Field(default=2, description="rerun: reruns from a checkpoint before failing")


def wsd_decay_steps(decay_fraction: float, steps: int) -> int:
    """Updates a WSD schedule of ``steps`` spends decaying: ``round(decay_fraction * steps)``, at least 1."""
    return max(1, round(decay_fraction * steps))


class ContinueFrom(Strict):
    """``train.continue_from``: start from a checkpoint of a committed train step instead of from the
    initial parameters (docs/how-to/continue-training.md).

    ``steps`` of the continued run counts every update the model has had, the parent's included: a
    400-step run continued with ``steps: 800`` runs 400 more. The batches are the parent's order
    continued (batch ``i`` of the parent's seed for ``i`` from the checkpoint's step on), so no batch
    of the parent is repeated at the seam.
    """

    step: StepId = Field(description="id of a committed train step under this storage root (`train-<12 hex>`, "
                         "as `tidal plan` or `tidal report` printed it for that run; any recipe's)")
    checkpoint: Literal["final"] | PositiveInt = Field(
        default="final", description="final: the checkpoint the parent committed last; or the step number "
        "of a checkpoint it kept (keep_checkpoints / checkpoint_permanent_every)")
    schedule: Literal["continue", "rewarm", "decay"] = Field(
        default="continue", description="continue: restore the optimizer state (Adam moments, update count) "
        "and follow this optimizer's schedule over all `steps` from the checkpoint's step on (equal to one "
        "uninterrupted run when the parent ran the same schedule, e.g. a constant LR: min_lr_ratio 1.0); "
        "rewarm: restore the parameters only, fresh Adam state, a new warmup and cosine decay over the "
        "`steps - checkpoint step` new updates; decay: a decay branch of a WSD trunk: restore the optimizer "
        "state and decay from lr (optimizer.decay_shape, to lr * min_lr_ratio) over the `steps - checkpoint "
        "step` new updates, bitwise a WSD run of `steps` that decays there")


class ResolvedContinue(ContinueFrom):
    """``continue_from`` as the planner writes it into the step config: what the user named plus what
    was read from the committed parent (hashed, so the step id depends on the checkpoint's content).

    A decay branch planned in the same recipe as its trunk (``train.decay_branches``) has no committed
    parent to read at plan time: ``checkpoint_root_hash`` is then None (the trunk's id, which is the
    content address of its checkpoints, is in ``step``) and ``input`` names the trunk's step."""

    checkpoint_step: PositiveInt = Field(description="completed updates of the parent's checkpoint")
    checkpoint_root_hash: Sha256Hex | None = Field(description="root hash of that checkpoint's manifest; None "
                                                   "for a trunk planned in the same recipe")
    data_seed: NonNegativeInt = Field(description="the parent's step seed: the batch order continued")
    input: InputStep = Field(default=CONTINUE_INPUT, description="the input step holding the parent")

    @model_serializer(mode="wrap")
    def _omit_in_recipe(self, handler: Any) -> dict[str, Any]:
        # a committed parent's reference dumps as before (its step ids unchanged)
        return omit_unused(handler(self), {"input": CONTINUE_INPUT})


# Upper bounds of the fields whose runaway value costs money or never ends (issue 43): each far above
# any run this pipeline is for, so only a typo or a hostile value meets it.
MAX_STEPS = 10_000_000  # ~8x the longest published pretraining runs (~1.2 M updates)
MAX_BATCH_SIZE = 65_536  # sequences; 32x the largest published batches (~2 k sequences of 8 k tokens)
MAX_BLOCK_BYTES = 256 << 20  # one GET; far above where a bigger read stops paying (tens of MiB on GCS/S3)
MAX_EVAL_BATCHES = 10_000  # per eval source and evaluation


class BlockReads(Strict):
    """The training data read in blocks of contiguous sequences (:class:`tidal.train.loader.BlockOrder`).

    Why: shuffling single rows costs one ranged GET per row per step on a bucket (256 rows of 4 KiB at
    sequence length 2,048 and 256 rows per host: about 256 GETs a step, tens of ms each). Here the
    stream is cut into blocks of at least ``block_bytes``; each epoch permutes the blocks, row ``r`` of
    every global batch reads its own lane of them, and the rows of ``window_blocks`` consecutive blocks
    of a lane are shuffled together. A host reads only its own lanes' blocks, one GET per block.
    """

    block_bytes: Annotated[int, Field(ge=4096, le=MAX_BLOCK_BYTES)] = Field(
        default=1 << 20, description="smallest read of contiguous sequences (bytes; one GET); fewer rows when the "
        "data has too few sequences for one block per batch row")
    window_blocks: Annotated[int, Field(ge=1, le=64)] = Field(
        default=2, description="blocks of a lane whose rows are shuffled together (host memory: rows per host x "
        "window_blocks x block_bytes)")


class TrainConfig(Strict):
    """A training run: model, optimizer, steps, batch, checkpoint and eval cadence, mesh.

    Intervals are in steps; the last step always checkpoints, evaluates and logs.
    """

    model: ModelConfig = Field(default=ModelConfig(), description="the transformer's shape")
    optimizer: OptimizerConfig = Field(default=OptimizerConfig(), description="AdamW and its schedule")
    steps: PositiveInt = Field(
        default=200, le=MAX_STEPS, description=f"optimizer updates to run; at most {MAX_STEPS:,} (about 8x the "
        "longest published pretraining runs: a larger value is a typo that would train without end)")
    batch_size: PositiveInt = Field(
        default=16, le=MAX_BATCH_SIZE, description=f"sequences per update (all devices); at most "
        f"{MAX_BATCH_SIZE:,} (32x the largest published batches: a larger value is a typo)")
    microbatches: PositiveInt = Field(
        default=1, description="split each step's batch into this many microbatches whose gradients are "
        "accumulated in a scan before the one update: the same update (within float32 rounding; for an MoE "
        "model the load-balancing loss is averaged over the microbatches instead) with the activations of "
        "batch_size / microbatches sequences; must divide batch_size")
    checkpoint_every: PositiveInt = Field(default=50, description="steps between checkpoints")
    keep_checkpoints: PositiveInt = Field(default=2, description="newest checkpoints kept on disk")
    eval_every: PositiveInt = Field(default=50, description="steps between held-out evaluations")
    eval_batches: PositiveInt = Field(
        default=4, le=MAX_EVAL_BATCHES, description="batches of batch_size sequences per eval source; at most "
        f"{MAX_EVAL_BATCHES:,} (every evaluation runs them all: a larger value stalls training)")
    log_every: PositiveInt = Field(default=10, description="steps between metrics lines")
    checkpoint_permanent_every: PositiveInt | None = Field(
        default=None, description="also keep every checkpoint whose step is a multiple of this, forever")
    mesh: MeshConfig | None = Field(default=None, description="device mesh axis sizes; null: derived")
    divergence: DivergenceConfig | None = Field(
        default=None, description="divergence guard (non-finite loss or grad norm, loss spikes); null: none")
    continue_from: ContinueFrom | None = Field(
        default=None, description="continue a committed train step's checkpoint to `steps` updates; null: "
        "train from the initial parameters")
    block_reads: BlockReads | None = Field(
        default=None, description="read the training data in shuffled blocks of contiguous sequences (few "
        "large GETs from a bucket); null: shuffled single sequences (existing recipes' order)")

    @model_validator(mode="after")
    def _warmup_below_steps(self) -> TrainConfig:
        # checked where the recipe (or a trigger's train_steps override) is loaded, not by the trainer
        # after every data step ran: a schedule whose warmup never ends is a mistake in the recipe
        if self.batch_size % self.microbatches:
            raise ValueError(f"microbatches ({self.microbatches}) must divide batch_size ({self.batch_size})")
        if self.optimizer.warmup_steps >= self.steps:
            raise ValueError(f"optimizer.warmup_steps ({self.optimizer.warmup_steps}) must be below "
                             f"steps ({self.steps})")
        opt = self.optimizer
        if opt.schedule == "wsd" and self.continue_from is None:
            decay = wsd_decay_steps(opt.decay_fraction, self.steps)
            if opt.warmup_steps + decay > self.steps:
                raise ValueError(f"optimizer: warmup_steps ({opt.warmup_steps}) plus the decay (decay_fraction "
                                 f"{opt.decay_fraction} of {self.steps} steps = {decay}) exceed steps ({self.steps})")
        if self.continue_from is not None and self.continue_from.schedule == "decay" and opt.schedule != "wsd":
            raise ValueError("continue_from.schedule decay branches a WSD trunk into its decay: set "
                             "optimizer.schedule: wsd (its decay_shape and min_lr_ratio shape the branch)")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # unset optional fields stay out of the step config, so existing recipes keep their step ids
        # (decay_branches: the recipe's TrainSection, tidal/recipe/training.py; one serializer per model tree)
        return omit_unused(handler(self), {**dict.fromkeys(("checkpoint_permanent_every", "mesh", "divergence",
                                                             "continue_from", "block_reads", "decay_branches")),
                                           "microbatches": 1})


class TrainStepConfig(TrainConfig):
    """The train step's config (``spec.json`` ``config``; docs/contracts.md, kind ``train``): a
    :class:`TrainConfig` plus the input step names the planner adds."""

    seed: NonNegativeInt | None = Field(
        default=None, description="the recipe seed (hashed into the step id); the trainer uses the spec's "
        "derived step seed")
    train_data: InputStep = Field(description="input step name of the mixture")
    eval_data: dict[str, InputStep] = Field(
        default_factory=dict, description="eval source name -> input step name of its tokenized data")
    heldout_data: dict[str, InputStep] = Field(
        default_factory=dict, description="training source name -> its tokenize step, whose held-out split "
        "is evaluated as heldout/<source> (tidal/data/heldout.py)")
    tokenizer: InputStep = Field(description="input step name of the tokenizer")
    continue_from: ResolvedContinue | None = Field(
        default=None, description=f"the parent checkpoint, read from the input step {CONTINUE_INPUT!r}")

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # as TrainConfig, and what the planner leaves out (no recipe seed, no held-out split): the model's
        # dump is the planned config, so spec.json holds what was hashed
        return omit_unused(handler(self), {**dict.fromkeys(("checkpoint_permanent_every", "mesh", "divergence",
                                                            "continue_from", "block_reads", "seed")),
                                           "heldout_data": {}, "microbatches": 1})

    @model_validator(mode="after")
    def _continues_forward(self) -> TrainStepConfig:
        ref = self.continue_from
        if ref is not None:
            problem = continuation_problem(self, ref.checkpoint_step)
            if problem:
                raise ValueError(f"continue_from: {problem}")
        return self


def continuation_problem(cfg: TrainConfig, checkpoint_step: int) -> str | None:
    """Why ``cfg`` cannot continue a checkpoint of ``checkpoint_step`` updates, or None: ``steps`` must
    be above it, and a rewarm's warmup must end before the new updates do."""
    ref = cfg.continue_from
    if cfg.steps <= checkpoint_step:
        return (f"steps ({cfg.steps}) must be above the checkpoint's step ({checkpoint_step}): steps counts "
                "every update, the parent's included")
    if ref is not None and ref.schedule == "rewarm" and cfg.optimizer.warmup_steps >= cfg.steps - checkpoint_step:
        return (f"schedule rewarm: optimizer.warmup_steps ({cfg.optimizer.warmup_steps}) must be below the new "
                f"updates (steps - checkpoint step = {cfg.steps - checkpoint_step})")
    return None



def describe_errors(err: ValidationError) -> str:
    """``dotted.field: rule (got value)`` for every problem of ``err``, ``; ``-separated
    (:func:`tidal.config.problems`)."""
    return "; ".join(problems(err))


def parse_step_config(config: Any, where: str | Path = SPEC_JSON) -> TrainStepConfig:
    """Validate a step config (``spec.json`` ``config``) with :class:`TrainStepConfig`.

    Raises:
        ConfigError: ``<where>: train config: <dotted.field>: <rule> (got <value>); ...``.
    """
    try:
        return TrainStepConfig.model_validate(config)
    except ValidationError as err:
        raise ConfigError(f"{where}: train config: {describe_errors(err)}") from None
