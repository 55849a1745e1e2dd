"""Recipe -> StepGraph: which steps a recipe needs and the exact config each one hashes.

Invariant: a step config holds only what changes the step's output. Locations and
resources (``storage_root``, ``tracking_uri``, ``train.resources``) never enter a config,
and a step only sees the recipe sections it reads, so a change to training fields leaves
every data step id unchanged. Only kinds that draw random numbers (mix, train) carry the
recipe ``seed``; each derives its own stream from it and its step name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal.config import RecipeError
from tidal.data.decontaminate_config import DecontaminateConfig
from tidal.data.eval_tasks import task_hash
from tidal.data.heldout import split_config
from tidal.eval.config import DownstreamSettings, EvalStepConfig
from tidal.recipe import Recipe, TrainConfig
from tidal.scaling.suite import FIT_STEP, Suite, plan_grid
from tidal.steps import Step, StepGraph

Continuation = Callable[[TrainConfig], tuple[Step, dict[str, Any]]]


def build_graph(recipe: Recipe, continuation: Continuation | None = None) -> StepGraph:
    """Plan every step of ``recipe``, inputs first.

    Graph: ``fetch-{src}`` -> ``clean-{src}`` -> (with ``decontamination``, for each training source,
    ``decontaminate-{src}``, reading also every eval source's clean step) -> ``tokenizer`` (train sources) ->
    ``tokenize-{src}`` -> ``mix`` (train sources) -> ``stats`` -> ``gate`` -> ``train``
    (mix, held-out tokenized sources, tokenizer, gate, and with ``train.continue_from`` the
    committed parent train step, ``continue-from``). With ``evaluation.heldout`` the tokenizer
    and the training sources' tokenize steps carry the split (:mod:`tidal.data.heldout`) and the
    train step also reads those tokenize steps, for their held-out part (``heldout_data``). With
    ``evaluation.downstream`` an ``eval`` step reads the train step and the tokenizer (:func:`eval_step`).

    Args:
        continuation: resolves ``train.continue_from`` against the storage root
            (:func:`tidal.core.continuation.resolve_continuation`, what :class:`tidal.core.pipeline.Pipeline`
            passes); needed only by a recipe that continues a run.

    Raises:
        RecipeError: the recipe continues a run and no ``continuation`` was given, or it refuses it.
    """
    steps: list[Step] = []
    clean_cfg = recipe.clean.model_dump()
    clean: dict[str, Step] = {}
    for src in sorted(recipe.sources):
        source = recipe.sources[src]
        fetch = Step(
            name=f"fetch-{src}",
            kind="fetch",
            config={"source": src, **source.fetch_config()},
        )
        clean[src] = Step(
            name=f"clean-{src}",
            kind="clean",
            config={"source": src, "input": fetch.name, **clean_cfg, **source.clean_overrides(recipe.clean.filters)},
            inputs=(fetch,),
        )
        steps += [fetch, clean[src]]

    # what the tokenizer and tokenize steps read of each source: its clean step, or for a training
    # source of a decontaminating recipe its decontaminate step (same document shards)
    documents = dict(clean)
    heldout = split_config(recipe.heldout_fraction, recipe.seed)  # None: the key is left out (ids unchanged)
    decontaminated: dict[str, Step] = {}
    if recipe.decontamination is not None:
        evals = {src: clean[src] for src in recipe.eval_sources}
        downstream = recipe.evaluation.downstream  # its tasks' items are indexed too (tidal/data/eval_tasks.py)
        eval_tasks = {t: task_hash(t) for t in downstream.tasks} if downstream is not None else {}
        for src in recipe.train_sources:
            decontaminated[src] = documents[src] = Step(
                name=f"decontaminate-{src}",
                kind="decontaminate",
                config=DecontaminateConfig(source=src, input=clean[src].name, **recipe.decontamination.model_dump(),
                                           eval={e: step.name for e, step in evals.items()},
                                           eval_tasks=eval_tasks, heldout=heldout).model_dump(),
                inputs=(clean[src], *evals.values()),
            )
            steps.append(decontaminated[src])

    tok_cfg = recipe.tokenizer.model_dump()
    if recipe.tokenizer.mode == "train":
        tok_cfg = {k: v for k, v in tok_cfg.items() if k not in ("path", "sha256")}
        if heldout is not None:  # the tokenizer never trains on held-out documents either
            tok_cfg["heldout"] = heldout
        tok_inputs = tuple(documents[src] for src in recipe.train_sources)
    else:
        tok_cfg = {"mode": "file", "path": recipe.tokenizer.path, "sha256": recipe.tokenizer.sha256}
        tok_inputs = ()
    tokenizer = Step(
        name="tokenizer",
        kind="tokenizer",
        config={
            **tok_cfg,
            "special_tokens": ["<|endoftext|>"],
            "sources": [s.name for s in tok_inputs],
        },
        inputs=tok_inputs,
    )
    steps.append(tokenizer)

    tokenized: dict[str, Step] = {}
    for src in sorted(recipe.sources):
        tokenized[src] = Step(
            name=f"tokenize-{src}",
            kind="tokenize",
            config={
                "source": src,
                "input": documents[src].name,
                "tokenizer": tokenizer.name,
                **recipe.tokenize.model_dump(),
                **({"heldout": heldout} if heldout is not None and src in recipe.mixture.weights else {}),
            },
            inputs=(documents[src], tokenizer),
        )
        steps.append(tokenized[src])

    mix = Step(
        name="mix",
        kind="mix",
        config={
            "seed": recipe.seed,
            "weights": dict(sorted(recipe.mixture.weights.items())),
            "inputs": {src: tokenized[src].name for src in recipe.train_sources},
            "n_sequences": recipe.mixture.n_sequences,
            "shards": recipe.mixture.shards,
            **recipe.mixture.size_config(),  # nothing for the default smallest_source: ids unchanged
        },
        inputs=tuple(tokenized[src] for src in recipe.train_sources),
    )
    stats = Step(
        name="stats",
        kind="stats",
        config={
            "clean": {src: clean[src].name for src in sorted(recipe.sources)},
            "tokenize": {src: tokenized[src].name for src in sorted(recipe.sources)},
            "mix": mix.name,
            **({"decontaminate": {src: step.name for src, step in decontaminated.items()}} if decontaminated else {}),
        },
        inputs=(*(clean[s] for s in sorted(recipe.sources)), *(tokenized[s] for s in sorted(recipe.sources)), mix,
                *decontaminated.values()),
    )
    gate = Step(
        name="gate",
        kind="gate",
        config={
            "stats": stats.name,
            **recipe.gate.model_dump(),
            "weights": dict(sorted(recipe.mixture.weights.items())),  # normalized by MixtureSettings
        },
        inputs=(stats,),
    )
    train_cfg = recipe.train.model_dump(exclude={"resources"})
    parent: tuple[Step, ...] = ()
    if recipe.train.continue_from is not None:
        if continuation is None:
            raise RecipeError("train.continue_from: resolving it needs the storage root; plan the recipe "
                              "through tidal.core.pipeline.Pipeline (tidal plan, tidal run)")
        step, train_cfg["continue_from"] = continuation(recipe.train)
        parent = (step,)
    heldout_srcs = recipe.train_sources if heldout is not None else []
    train = Step(
        name="train",
        kind="train",
        config={
            "seed": recipe.seed,
            **train_cfg,
            "train_data": mix.name,
            "eval_data": {src: tokenized[src].name for src in recipe.eval_sources},
            **({"heldout_data": {src: tokenized[src].name for src in heldout_srcs}} if heldout_srcs else {}),
            "tokenizer": tokenizer.name,
        },
        inputs=(mix, tokenizer, *(tokenized[src] for src in sorted({*recipe.eval_sources, *heldout_srcs})), gate,
                *parent),
    )
    steps += [mix, stats, gate, *parent, train]
    if recipe.evaluation.downstream is not None:
        steps.append(eval_step(recipe.evaluation.downstream, train, tokenizer, recipe.tokenize.seq_len))
    return StepGraph(tuple(steps))


def eval_step(settings: DownstreamSettings, train: Step, tokenizer: Step, seq_len: int) -> Step:
    """The ``eval`` step of ``evaluation.downstream``: the tasks' definition hashes and lm-eval's version are
    hashed, so editing a task or upgrading lm-eval gives it a new id (tidal/eval/step.py). ``seq_len``: the
    packed sequence length the model was trained on (its context is one token less)."""
    from tidal.eval.step import lm_eval_version

    return Step(
        name="eval",
        kind="eval",
        config=EvalStepConfig(**settings.model_dump(), task_hashes={t: task_hash(t) for t in settings.tasks},
                              train=train.name, tokenizer=tokenizer.name, lm_eval_version=lm_eval_version(),
                              seq_len=seq_len).model_dump(),
        inputs=(train, tokenizer),
    )


def build_suite_graph(suite: Suite, base: Recipe) -> StepGraph:
    """The suite's steps: the base recipe's data steps (same ids), one train step per grid
    point, then the ``fit`` step reading every train step (the base recipe's eval step is left out)."""
    base_graph = build_graph(base)
    base_train = base_graph["train"]
    data_steps = [s for s in base_graph if s.kind not in ("train", "eval")]  # grid points are not evaluated downstream
    inputs = base_train.inputs
    ref_cfg = dict(base_train.config)
    points = plan_grid(suite, base)
    trains = []
    for p in points:
        optimizer = {**ref_cfg["optimizer"], "lr": p.lr, "warmup_steps": p.warmup_steps}
        config = {**ref_cfg, "model": p.model, "optimizer": optimizer, "steps": p.steps,
                  "batch_size": p.batch_size, "eval_every": p.steps, "eval_batches": suite.train.eval_batches,
                  "checkpoint_every": min(suite.train.checkpoint_every or p.steps, p.steps),
                  "log_every": min(suite.train.log_every, p.steps)}
        trains.append(Step(name=p.name, kind="train", config=config, inputs=inputs))
    fit = Step(
        name=FIT_STEP,
        kind="scaling_fit",
        config={
            "seed": base.seed,
            "loss": suite.fit.loss,
            "tail_fraction": suite.fit.tail_fraction,
            "n_params": suite.fit.n_params,
            "n_boot": suite.fit.n_boot,
            "holdout": suite.fit.holdout,
            "forecast_flops": sorted(suite.fit.forecast_flops),
            "runs": {p.name: {"budget": p.budget, "model": p.model, "planned_flops": p.flops,
                              "planned_tokens": p.tokens} for p in points},
        },
        inputs=tuple(trains),
    )
    return StepGraph((*data_steps, *trains, fit))


def train_step_names(graph: StepGraph) -> list[str]:
    """Names of the grid's train steps (what the DAG maps over)."""
    return [s.name for s in graph if s.kind == "train"]
