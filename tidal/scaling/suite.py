"""Scaling-suite files: an isoFLOP grid of training runs on one base recipe's data.

A suite file is YAML with top-level ``kind: scaling_suite``. It names a base recipe (``base``,
resolved relative to the suite file) whose data steps (fetch … gate) are reused unchanged —
same configs, same step ids, so the data is computed once and shared with the base recipe's
own DAG — and a grid: compute budgets C (FLOPs) and, per budget, model sizes ``d{d_model}l{n_layers}``.
Each grid point becomes one ``train`` step named ``train-c{budget}-d{d}l{L}`` (e.g.
``train-c3e13-d64l2``), and one ``fit`` step (kind ``scaling_fit``) reads them all. Growing
the grid adds only the new train steps and a new fit step; every other id stays.

Per grid point (C, model), with context T = ``tokenize.seq_len - 1`` predicted tokens per
sequence (what the trainer counts) and V the base recipe's ``tokenizer.vocab_size``:

* FLOPs per token ``f = flops_per_token(model, T)``, the trainer's MFU formula
  (:func:`tidal.train.flops.flops_per_token`: Kaplan et al. 2020 + PaLM attention term);
* tokens ``D = C / f``; batch ``B`` by the batch rule below; steps ``S = round(D / (B·T))``
  (at least ``rules.min_steps``, else the point is refused); trained tokens are ``S·B·T``,
  so the realized C differs from the nominal one by the rounding (the fit uses the realized).

Optimizer settings scale from the reference configuration, the base recipe's ``train``
section (width ``d_ref``, ``lr_ref``, ``B_ref``, ``S_ref``, ``warmup_ref``; reference tokens
``D_ref = S_ref·B_ref·T``), by these rules:

* **learning rate** ``lr = lr_ref · (d_ref / d)^p``, ``p = rules.lr_width_exponent``
  (default 0.5). µP (Yang et al. 2022, "Tensor Programs V", Table 3) prescribes ``1/d`` for
  Adam on hidden weights under its own parametrization; this model uses the standard
  parametrization with one global learning rate, where the optimum moves more slowly with
  width (Everett et al. 2024, "Scaling Exponents Across Parameterizations and Optimizers"),
  so the default takes the square root; ``p = 0`` keeps ``lr_ref``.
* **batch size** ``B = 2^round(log2(B_ref · (D / D_ref)^q))`` clipped to
  ``[rules.batch_min, rules.batch_max]``, ``q = rules.batch_token_exponent`` (default 0.4).
  The optimal and the critical batch size grow as a power of the training tokens D, not of
  the model size (Zhang et al. 2024, "How Does Critical Batch Size Scale in Pre-training?";
  Bergsma et al. 2025, "Power Lines"); ``q = 0`` fixes the batch at ``B_ref``. With
  ``rules.batch_multiple = m`` B rounds to the nearest multiple of m instead: at a few hundred
  steps a factor-2 jump in B between neighbouring runs of one budget halves one run's step
  count and bends its isoFLOP curve.
* **warmup** ``round(w · S)`` steps with ``w = rules.warmup_fraction`` (default
  ``warmup_ref / S_ref``); the cosine decay spans the whole run, matching each run's length
  as Hoffmann et al. 2022 (§3.1, Figure A1) require for the isoFLOP curves to be valid.
* everything else (``min_lr_ratio``, weight decay, Adam betas, clipping) as the reference.

Parameter count N (``fit.n_params``): ``total`` (default) counts every parameter, embeddings and
output head included, as Hoffmann et al. 2022 do (Pearce & Song 2024, "Reconciling Kaplan and
Chinchilla Scaling Laws", §2, trace part of the Kaplan/Chinchilla gap to exactly this choice);
it matches the FLOPs formula, which counts the output head's matmul. ``non_embedding`` is Kaplan
et al. 2020's N (§2.1: without the embedding matrices; here also without the untied head).
With a 4,096-token vocabulary and widths of 16 … 64 the embedding and head are 60 … 97 % of N
and most of the FLOPs, so the compute-optimal models of CPU-sized budgets are very narrow; a
grid must sample both flanks of each isoFLOP curve (the fit flags curves that do not) and, for
the ``train_loss_tail`` loss, keep every run under one epoch of the mixture.

Checkpoint and eval cadence are one checkpoint and one eval at the end (plus every
``train.checkpoint_every`` steps when set), with ``train.eval_batches`` batches per source.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tidal.config import problems
from tidal.recipe import Recipe, RecipeError, load_recipe
from tidal.recipe.loader import read_yaml
from tidal.train.flops import ModelShape, flops_per_token, param_count

SUITE_KIND = "scaling_suite"
FIT_STEP = "fit"
MODEL_NAME = re.compile(r"^d(\d+)l(\d+)$")


class SuiteError(RecipeError):
    """A suite file is invalid; the message names the file, the field and the rule."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    """One isoFLOP curve: a compute budget and the model sizes trained at it."""

    flops: Annotated[float, Field(gt=0)] = Field(description="training FLOPs of every run of this budget")
    models: list[str] = Field(min_length=1, description="model presets d{d_model}l{n_layers}, e.g. d64l2")

    @model_validator(mode="after")
    def _names(self) -> Budget:
        bad = [m for m in self.models if not MODEL_NAME.match(m)]
        if bad:
            raise ValueError(f"model names {bad} do not match d{{d_model}}l{{n_layers}} (e.g. d64l2)")
        dup = sorted({m for m in self.models if self.models.count(m) > 1})
        if dup:
            raise ValueError(f"models {dup} listed twice for budget {self.flops:g}")
        return self


class ModelRules(_Strict):
    """How a preset ``d{d}l{L}`` becomes a model shape."""

    head_dim: Annotated[int, Field(gt=0)] = Field(default=16, description="n_heads = d_model / head_dim")
    ffn_ratio: Annotated[float, Field(gt=0)] = Field(default=4.0, description="d_ff = ffn_ratio * d_model")


class ScalingRules(_Strict):
    """Exponents and bounds of the optimizer scaling rules (module docstring gives sources)."""

    lr_width_exponent: Annotated[float, Field(ge=0, le=2)] = 0.5
    batch_token_exponent: Annotated[float, Field(ge=0, le=1)] = 0.4
    batch_min: Annotated[int, Field(gt=0)] = 4
    batch_max: Annotated[int, Field(gt=0)] = 256
    batch_multiple: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="round B to a multiple of this instead of a power of two")
    warmup_fraction: Annotated[float, Field(ge=0, lt=1)] | None = None
    min_steps: Annotated[int, Field(gt=0)] = 20


class SuiteTrain(_Strict):
    """Training cadence of the grid runs (not scaled)."""

    eval_batches: Annotated[int, Field(gt=0)] = 8
    checkpoint_every: Annotated[int, Field(gt=0)] | None = Field(
        default=None, description="default: one checkpoint at the end")
    log_every: Annotated[int, Field(gt=0)] = 10


class FitConfig(_Strict):
    """What the fit step fits and forecasts (:mod:`tidal.scaling.fit_step` gives the details)."""

    loss: Literal["train_loss_tail", "eval_loss", "final_train_loss"] = Field(
        default="train_loss_tail",
        description="train_loss_tail: mean training loss over the last tail_fraction of each run; "
                    "while a run sees < 1 epoch every batch is unseen in-distribution data, so this "
                    "estimates held-out loss (runs past one epoch are flagged). eval_loss: the base "
                    "recipe's final eval (may be out of distribution); final_train_loss: one batch")
    tail_fraction: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.2, description="train_loss_tail averages the logged steps after (1 - this) x steps")
    n_params: Literal["total", "non_embedding"] = Field(
        default="total",
        description="N fitted: total parameters (Hoffmann et al. 2022) or without the embedding "
                    "and output head (Kaplan et al. 2020)")
    n_boot: Annotated[int, Field(ge=10)] = 200
    forecast_flops: list[Annotated[float, Field(gt=0)]] = Field(default_factory=list)
    holdout: bool = Field(default=True, description="leave-the-largest-budget-out validation")


class FitRun(_Strict):
    """One grid run as the fit step reads it: its nominal budget, shape and planned FLOPs and tokens."""

    budget: float
    model: dict[str, int]
    planned_flops: float
    planned_tokens: int


class FitStepConfig(FitConfig):
    """The ``scaling_fit`` step's config: the suite's ``fit`` settings, the recipe seed (bootstrap
    draws) and the grid runs it reads (:mod:`tidal.scaling.fit_step`)."""

    seed: int
    runs: dict[str, FitRun] = Field(min_length=1)


class Suite(_Strict):
    """A scaling suite: base recipe, grid, rules, fit settings."""

    kind: Literal["scaling_suite"]
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="DAG id suffix: tidal_<name>")
    version: Annotated[int, Field(gt=0)]
    description: str = ""
    base: str = Field(description="base recipe YAML, relative to the suite file")
    budgets: list[Budget] = Field(min_length=1)
    models: ModelRules = ModelRules()
    rules: ScalingRules = ScalingRules()
    train: SuiteTrain = SuiteTrain()
    fit: FitConfig = FitConfig()
    storage_root: str | None = Field(default=None, description="default: the base recipe's (not hashed)")
    tracking_uri: str | None = Field(default=None, description="default: the base recipe's (not hashed)")

    @model_validator(mode="after")
    def _unique_budgets(self) -> Suite:
        tags = [budget_tag(b.flops) for b in self.budgets]
        dup = sorted({t for t in tags if tags.count(t) > 1})
        if dup:
            raise ValueError(f"budgets {dup} are listed twice (budgets are compared at 3 significant digits)")
        return self


@dataclass(frozen=True)
class GridPoint:
    """One planned run: its step name, shape, FLOPs and optimizer settings.

    Attributes:
        name: step name ``train-c{budget}-d{d}l{L}``.
        budget: nominal C (FLOPs); flops: planned realized C = steps·B·T·f.
        model: ``{d_model, n_layers, n_heads, d_ff}``; n_params: N (parameters).
        flops_per_token: f (FLOPs per trained token); tokens: planned D = steps·B·T.
        batch_size, steps, warmup_steps, lr: the scaled optimizer settings.
    """

    name: str
    budget: float
    model: dict[str, int]
    n_params: int
    flops_per_token: int
    tokens: int
    flops: float
    batch_size: int
    steps: int
    warmup_steps: int
    lr: float


def budget_tag(flops: float) -> str:
    """``3e13`` for 3.0e13, ``1p5e13`` for 1.5e13 (3 significant digits)."""
    mantissa, exponent = f"{flops:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".").replace(".", "p")
    return f"{mantissa}e{int(exponent)}"


def is_suite_file(path: str | Path) -> bool:
    """True when ``path`` is YAML whose top level has ``kind: scaling_suite`` (cheap check)."""
    try:
        data = read_yaml(path)
    except RecipeError:
        return False
    return isinstance(data, dict) and data.get("kind") == SUITE_KIND


def load_suite(path: str | Path) -> tuple[Suite, Recipe]:
    """Read and validate a suite file and its base recipe.

    Raises:
        SuiteError: unreadable file, bad fields (file and dotted field path), a bad base recipe,
            or a grid point that cannot be planned (too few steps, bad shape).
    """
    path = Path(path)
    try:
        data = read_yaml(path, "suite")
    except RecipeError as err:
        raise SuiteError(str(err)) from None
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: a suite must be a YAML mapping")
    try:
        suite = Suite.model_validate(data)
    except ValidationError as err:
        lines = problems(err, yaml_hints=True)
        raise SuiteError("\n".join([f"{path}: {err.error_count()} problem(s) in the suite:",
                                    *(f"  {line}" for line in lines)])) from None
    base_path = (path.parent / suite.base).resolve()
    try:
        base = load_recipe(base_path)
    except RecipeError as err:
        raise SuiteError(f"{path}: base recipe {suite.base!r}: {err}") from None
    if base.tokenizer.mode != "train":
        raise SuiteError(f"{path}: base recipe {suite.base!r} must train its tokenizer "
                         "(the planned FLOPs need its vocab_size)")
    plan_grid(suite, base, where=str(path))
    return suite, base


def model_shape(name: str, rules: ModelRules) -> dict[str, int]:
    """``d64l2`` -> ``{d_model: 64, n_layers: 2, n_heads: 64/head_dim, d_ff: ffn_ratio·64}``.

    Raises:
        ValueError: d_model not a multiple of head_dim, or an odd head_dim (RoPE rotates pairs).
    """
    match = MODEL_NAME.match(name)
    if not match:
        raise ValueError(f"model {name!r} does not match d{{d_model}}l{{n_layers}}")
    d, layers = int(match.group(1)), int(match.group(2))
    if d % rules.head_dim or rules.head_dim % 2 or d == 0 or layers == 0:
        raise ValueError(f"model {name!r}: d_model {d} must be a positive multiple of the even "
                         f"head_dim {rules.head_dim}, n_layers positive")
    return {"d_model": d, "n_layers": layers, "n_heads": d // rules.head_dim,
            "d_ff": round(rules.ffn_ratio * d)}


def plan_grid(suite: Suite, base: Recipe, where: str = "<suite>") -> list[GridPoint]:
    """Every grid point, budgets ascending then models as listed.

    Raises:
        SuiteError: a point with fewer than ``rules.min_steps`` steps or a bad model name.
    """
    ref = base.train
    rules = suite.rules
    context = base.tokenize.seq_len - 1
    vocab = base.tokenizer.vocab_size
    d_ref, lr_ref, b_ref = ref.model.d_model, ref.optimizer.lr, ref.batch_size
    tokens_ref = ref.steps * b_ref * context
    warmup_fraction = (rules.warmup_fraction if rules.warmup_fraction is not None
                       else ref.optimizer.warmup_steps / ref.steps)
    points = []
    for budget in sorted(suite.budgets, key=lambda b: b.flops):
        for name in budget.models:
            try:
                shape = model_shape(name, suite.models)
            except ValueError as err:
                raise SuiteError(f"{where}: budgets[{budget.flops:g}]: {err}") from None
            model = ModelShape(vocab_size=vocab, **shape)
            fpt = flops_per_token(model, context)
            tokens = budget.flops / fpt
            raw_batch = b_ref * (tokens / tokens_ref) ** rules.batch_token_exponent
            if rules.batch_multiple:
                rounded = rules.batch_multiple * max(1, round(raw_batch / rules.batch_multiple))
            else:
                rounded = 2 ** round(math.log2(raw_batch))
            batch = int(min(max(rounded, rules.batch_min), rules.batch_max))
            steps = round(tokens / (batch * context))
            if steps < rules.min_steps:
                raise SuiteError(f"{where}: budget {budget.flops:g} with model {name}: {steps} steps of "
                                 f"{batch}x{context} tokens (f = {fpt:,} FLOPs/token) is below "
                                 f"rules.min_steps={rules.min_steps}; raise the budget or drop the model")
            warmup = min(round(warmup_fraction * steps), steps - 1)
            lr = lr_ref * (d_ref / shape["d_model"]) ** rules.lr_width_exponent
            points.append(GridPoint(
                name=f"train-c{budget_tag(budget.flops)}-{name}", budget=float(budget.flops), model=shape,
                n_params=param_count(model),
                flops_per_token=fpt, tokens=steps * batch * context, flops=float(steps * batch * context * fpt),
                batch_size=batch, steps=steps, warmup_steps=warmup, lr=float(f"{lr:.6g}")))
    return points
