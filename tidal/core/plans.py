"""The planning functions of the step kinds: each builds its kind's step(s) from the recipe and the
steps planned before it (:attr:`tidal.kinds.KindSpec.plan`; :func:`tidal.core.planner.build_graph`
calls them in the order of :data:`tidal.kinds.KINDS`).

Invariant: a step config holds only what changes the step's output, and it is parsed into the
kind's config model here, at plan time (:func:`planned`): a config the model refuses is a
:class:`RecipeError` naming the step and the field before anything runs, and the parsed model is
what the step's run receives (:attr:`tidal.steps.Step.typed_config`). What is hashed is the planned
dict, unchanged, so step ids do not depend on the models' defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pydantic import ValidationError

from tidal.config import RecipeError, problems
from tidal.data.eval_tasks import task_hash
from tidal.data.heldout import split_config
from tidal.eval.config import DownstreamSettings, lm_eval_version
from tidal.kinds import kind_spec
from tidal.recipe import Recipe, TrainConfig
from tidal.scaling.suite import FIT_STEP, GridPoint, Suite, plan_grid
from tidal.steps import Step, derive_seed

Continuation = Callable[[TrainConfig], tuple[Step, dict[str, Any]]]


@dataclass
class Planning:
    """What a planning function reads: the recipe, the steps planned so far (by name, in graph
    order), and for a scaling suite the suite (its grid replaces the recipe's train step).

    Attributes:
        continuation: resolves ``train.continue_from`` against the storage root (None: a recipe
            that continues a run is refused).
    """

    recipe: Recipe
    continuation: Continuation | None = None
    suite: Suite | None = None
    steps: dict[str, Step] = field(default_factory=dict)

    @cached_property
    def heldout(self) -> dict[str, Any] | None:
        """The held-out split (:mod:`tidal.data.heldout`); None: the key is left out (ids unchanged)."""
        return split_config(self.recipe.heldout_fraction, self.recipe.seed)

    @cached_property
    def points(self) -> list[GridPoint]:
        """The suite's grid points (:func:`tidal.scaling.suite.plan_grid`)."""
        assert self.suite is not None
        return plan_grid(self.suite, self.recipe)

    def documents(self, src: str) -> Step:
        """What the tokenizer and tokenize steps read of ``src``: its decontaminate step (a training
        source of a decontaminating recipe; same document shards), else its clean step."""
        return self.steps.get(f"decontaminate-{src}") or self.steps[f"clean-{src}"]

    def of(self, prefix: str, sources: list[str]) -> dict[str, Step]:
        """``{src: step "{prefix}-{src}"}`` for ``sources`` that were planned."""
        return {src: self.steps[f"{prefix}-{src}"] for src in sources if f"{prefix}-{src}" in self.steps}


def planned(name: str, kind: str, config: dict[str, Any], inputs: tuple[Step, ...] = (), *,
            hash_dump: bool = False) -> Step:
    """A step whose config is parsed now into its kind's model (kept on the step, never hashed).
    What is hashed is ``config`` as planned, or with ``hash_dump`` the model's dump (kinds whose
    model leaves out what is unused, so that a new optional field changes no id).

    Raises:
        RecipeError: the model refuses the config: names the step and each field and rule.
    """
    try:
        model = kind_spec(kind).parse_config(config)
    except ValidationError as err:
        raise RecipeError(f"step {name} ({kind}): the planned config is refused: "
                          + "; ".join(problems(err, unknown="unknown key"))) from None
    return Step(name=name, kind=kind, config=model.model_dump() if hash_dump else config, inputs=inputs, model=model)


def plan_fetch(p: Planning) -> list[Step]:
    """``fetch-{src}`` for every source: where its corpus comes from."""
    return [planned(f"fetch-{src}", "fetch", {"source": src, **p.recipe.sources[src].fetch_config()})
            for src in sorted(p.recipe.sources)]


def plan_clean(p: Planning) -> list[Step]:
    """``clean-{src}`` for every source: the recipe's ``clean`` section, the source's merged filters and language."""
    recipe = p.recipe
    settings = recipe.clean.model_dump()
    steps = []
    for src in sorted(recipe.sources):
        fetch = p.steps[f"fetch-{src}"]
        config = {"source": src, "input": fetch.name, **settings,
                  **recipe.sources[src].clean_overrides(recipe.clean.filters)}
        steps.append(planned(f"clean-{src}", "clean", config, (fetch,)))
    return steps


def plan_decontaminate(p: Planning) -> list[Step]:
    """With ``decontamination``: ``decontaminate-{src}`` for each training source, reading also every
    eval source's clean step (and indexing the downstream eval tasks' items, tidal/data/eval_tasks.py)."""
    recipe = p.recipe
    if recipe.decontamination is None:
        return []
    evals = p.of("clean", recipe.eval_sources)
    downstream = recipe.evaluation.downstream
    eval_tasks = {t: task_hash(t) for t in downstream.tasks} if downstream is not None else {}
    steps = []
    for src in recipe.train_sources:
        clean = p.steps[f"clean-{src}"]
        config = {"source": src, "input": clean.name, **recipe.decontamination.model_dump(),
                  "eval": {e: step.name for e, step in evals.items()}, "eval_tasks": eval_tasks,
                  "heldout": p.heldout}
        steps.append(planned(f"decontaminate-{src}", "decontaminate", config, (clean, *evals.values()),
                             hash_dump=True))
    return steps


def plan_tokenizer(p: Planning) -> list[Step]:
    """``tokenizer``: trained on the training sources' documents (never their held-out part), or a file."""
    recipe = p.recipe
    config = recipe.tokenizer.model_dump()
    if recipe.tokenizer.mode == "train":
        config = {k: v for k, v in config.items() if k not in ("path", "sha256")}
        if p.heldout is not None:
            config["heldout"] = p.heldout
        inputs = tuple(p.documents(src) for src in recipe.train_sources)
    else:
        config = {"mode": "file", "path": recipe.tokenizer.path, "sha256": recipe.tokenizer.sha256}
        inputs = ()
    config = {**config, "special_tokens": ["<|endoftext|>"], "sources": [s.name for s in inputs]}
    return [planned("tokenizer", "tokenizer", config, inputs)]


def plan_tokenize(p: Planning) -> list[Step]:
    """``tokenize-{src}`` for every source (a training source carries the held-out split)."""
    recipe = p.recipe
    tokenizer = p.steps["tokenizer"]
    steps = []
    for src in sorted(recipe.sources):
        documents = p.documents(src)
        heldout = p.heldout is not None and src in recipe.mixture.weights
        config = {"source": src, "input": documents.name, "tokenizer": tokenizer.name, **recipe.tokenize.model_dump(),
                  **({"heldout": p.heldout} if heldout else {})}
        steps.append(planned(f"tokenize-{src}", "tokenize", config, (documents, tokenizer)))
    return steps


def plan_mix(p: Planning) -> list[Step]:
    """``mix``: the training sources' tokenized sequences by the mixture weights."""
    recipe = p.recipe
    tokenized = p.of("tokenize", recipe.train_sources)
    config = {"seed": recipe.seed, "weights": dict(sorted(recipe.mixture.weights.items())),
              "inputs": {src: step.name for src, step in tokenized.items()},
              "n_sequences": recipe.mixture.n_sequences, "shards": recipe.mixture.shards,
              **recipe.mixture.size_config(),  # nothing for the default smallest_source: ids unchanged
              **recipe.mixture.load_time_config()}  # nothing for a copied mixture
    if recipe.mixture.uses_steps():
        if p.suite is not None:
            raise RecipeError("mixture.stages: until_step needs one batch size, and a scaling suite's grid points "
                              "have their own; end the stages with until_fraction")
        config["batch_size"] = recipe.train.batch_size
    return [planned("mix", "mix", config, tuple(tokenized.values()))]


def plan_stats(p: Planning) -> list[Step]:
    """``stats``: every clean, tokenize and decontaminate step and the mix."""
    sources = sorted(p.recipe.sources)
    clean, tokenized = p.of("clean", sources), p.of("tokenize", sources)
    decontaminated = p.of("decontaminate", p.recipe.train_sources)
    config = {"clean": {src: s.name for src, s in clean.items()},
              "tokenize": {src: s.name for src, s in tokenized.items()}, "mix": "mix",
              **({"decontaminate": {src: s.name for src, s in decontaminated.items()}} if decontaminated else {})}
    inputs = (*clean.values(), *tokenized.values(), p.steps["mix"], *decontaminated.values())
    return [planned("stats", "stats", config, inputs)]


def plan_gate(p: Planning) -> list[Step]:
    """``gate``: the recipe's ``gate`` section over the stats (weights normalized by MixtureSettings)."""
    recipe = p.recipe
    weights = recipe.mixture.expected_weights(recipe.tokenize.seq_len, recipe.train.batch_size)  # staged: overall
    config = {"stats": "stats", **recipe.gate.model_dump(), "weights": dict(sorted(weights.items()))}
    return [planned("gate", "gate", config, (p.steps["stats"],))]


def plan_train(p: Planning) -> list[Step]:
    """``train`` (mix, tokenizer, eval and held-out tokenize steps, gate, and with ``train.continue_from``
    the committed parent train step, ``continue-from``); for a suite, one train step per grid point instead.

    Raises:
        RecipeError: the recipe continues a run and there is no continuation, or it refuses it.
    """
    recipe = p.recipe
    config = recipe.train.model_dump(exclude={"resources", "decay_branches"})  # branches: steps of their own
    parent: tuple[Step, ...] = ()
    if recipe.train.continue_from is not None:
        if p.continuation is None:
            raise RecipeError("train.continue_from: resolving it needs the storage root; plan the recipe "
                              "through tidal.core.pipeline.Pipeline (tidal plan, tidal run)")
        step, config["continue_from"] = p.continuation(recipe.train)
        parent = (step,)
    heldout = recipe.train_sources if p.heldout is not None else []
    mixed = recipe.train_sources if recipe.mixture.load_time else []  # read in place, by the mixture's index
    tokenized = p.of("tokenize", sorted({*recipe.eval_sources, *heldout, *mixed}))
    config = {"seed": recipe.seed, **config, "train_data": "mix",
              "eval_data": {src: f"tokenize-{src}" for src in recipe.eval_sources},
              **({"heldout_data": {src: f"tokenize-{src}" for src in heldout}} if heldout else {}),
              "tokenizer": "tokenizer"}
    inputs = (p.steps["mix"], p.steps["tokenizer"], *tokenized.values(), p.steps["gate"], *parent)
    if p.suite is None:
        trunk = planned("train", "train", config, inputs)
        return [*parent, trunk, *decay_branches(recipe, trunk, config, inputs)]
    if recipe.train.decay_branches:
        raise RecipeError("train.decay_branches: not in a scaling suite (its grid points are the runs); branch a "
                          "recipe's own train step")
    train = p.suite.train
    return [planned(g.name, "train", {**config, "model": g.model, "steps": g.steps, "batch_size": g.batch_size,
                                      "optimizer": {**config["optimizer"], "lr": g.lr, "warmup_steps": g.warmup_steps},
                                      "eval_every": g.steps, "eval_batches": train.eval_batches,
                                      "checkpoint_every": min(train.checkpoint_every or g.steps, g.steps),
                                      "log_every": min(train.log_every, g.steps)}, inputs)
            for g in p.points]


def branch_name(trunk: str, at: int, k: int) -> str:
    """The step name of a decay branch of ``trunk`` from checkpoint ``at`` over ``k`` updates."""
    return f"{trunk}-decay-{at}-{k}"


def decay_branches(recipe: Any, trunk: Step, config: dict[str, Any], inputs: tuple[Step, ...]) -> list[Step]:
    """``train.decay_branches``: per branch ``(at, k)`` a train step ``train-decay-<at>-<k>`` that restores the
    trunk's permanent checkpoint ``at`` and decays over ``k`` updates (``continue_from.schedule: decay``,
    bitwise the WSD run of ``at + k`` steps that decays there). Its id follows the trunk's id, ``at`` and ``k``:
    the trunk is read as an input of the same graph, so no checkpoint hash is known at plan time and none is
    hashed (the trunk's id is the content address of its checkpoints). The batches continue the trunk's order."""
    ref = config.get("continue_from")
    data_seed = ref["data_seed"] if ref else derive_seed(int(config["seed"]), trunk.name)
    return [planned(branch_name(trunk.name, at, k), "train", {
        **config, "steps": at + k,
        "continue_from": {"step": trunk.step_id, "checkpoint": at, "schedule": "decay", "checkpoint_step": at,
                          "checkpoint_root_hash": None, "data_seed": data_seed, "input": trunk.name}},
        (*inputs, trunk)) for at, k in recipe.train.branch_points()]


def plan_eval(p: Planning) -> list[Step]:
    """With ``evaluation.downstream`` (and no suite: grid points are not evaluated downstream): ``eval``."""
    downstream = p.recipe.evaluation.downstream
    if downstream is None or p.suite is not None:
        return []
    seq_len, tokenizer = p.recipe.tokenize.seq_len, p.steps["tokenizer"]
    branches = [p.steps[branch_name("train", at, k)] for at, k in p.recipe.train.branch_points()]
    return [eval_step(downstream, p.steps["train"], tokenizer, seq_len),  # the trunk's first: eval_step_of's
            *(eval_step(downstream, branch, tokenizer, seq_len, name=f"eval-{branch.name}") for branch in branches)]


def eval_step(settings: DownstreamSettings, train: Step, tokenizer: Step, seq_len: int, name: str = "eval") -> Step:
    """The ``eval`` step of ``evaluation.downstream`` (``name``: ``eval-<branch>`` for a decay branch's): the
    tasks' definition hashes and lm-eval's version are hashed, so editing a task or upgrading lm-eval gives it a
    new id (tidal/eval/step.py). ``seq_len``: the packed sequence length the model was trained on (its context
    is one token less)."""
    config = {**settings.model_dump(), "task_hashes": {t: task_hash(t) for t in settings.tasks},
              "train": train.name, "tokenizer": tokenizer.name, "lm_eval_version": lm_eval_version(),
              "seq_len": seq_len}
    return planned(name, "eval", config, (train, tokenizer), hash_dump=True)


def plan_scaling_fit(p: Planning) -> list[Step]:
    """For a suite: the ``fit`` step reading every grid point's train step."""
    if p.suite is None:
        return []
    fit = p.suite.fit
    config = {"seed": p.recipe.seed, "loss": fit.loss, "tail_fraction": fit.tail_fraction, "n_params": fit.n_params,
              "n_boot": fit.n_boot, "holdout": fit.holdout, "forecast_flops": sorted(fit.forecast_flops),
              "runs": {g.name: {"budget": g.budget, "model": g.model, "planned_flops": g.flops,
                                "planned_tokens": g.tokens} for g in p.points}}
    return [planned(FIT_STEP, "scaling_fit", config, tuple(p.steps[g.name] for g in p.points))]


__all__ = ["Continuation", "Planning", "eval_step", "plan_clean", "plan_decontaminate", "plan_eval", "plan_fetch",
           "plan_gate", "plan_mix", "plan_scaling_fit", "plan_stats", "plan_tokenize", "plan_tokenizer", "plan_train",
           "planned"]
