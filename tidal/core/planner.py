"""Recipe -> StepGraph: which steps a recipe needs and the exact config each one hashes.

Invariant: a step config holds only what changes the step's output. Locations and
resources (``storage_root``, ``tracking_uri``, ``train.resources``) never enter a config,
and a step only sees the recipe sections it reads, so a change to training fields leaves
every data step id unchanged. Only kinds that draw random numbers (mix, train) carry the
recipe ``seed``; each derives its own stream from it and its step name.
"""

from __future__ import annotations

from tidal.core.plans import Continuation, Planning, eval_step
from tidal.kinds import KINDS
from tidal.recipe import Recipe
from tidal.scaling.suite import Suite
from tidal.steps import StepGraph


def build_graph(recipe: Recipe, continuation: Continuation | None = None, suite: Suite | None = None) -> StepGraph:
    """Plan every step of ``recipe``, inputs first.

    Graph: ``fetch-{src}`` -> ``clean-{src}`` -> (with ``decontamination``, for each training source,
    ``decontaminate-{src}``, reading also every eval source's clean step) -> ``tokenizer`` (train sources) ->
    ``tokenize-{src}`` -> ``mix`` (train sources) -> ``stats`` -> ``gate`` -> ``train``
    (mix, held-out tokenized sources, tokenizer, gate, and with ``train.continue_from`` the
    committed parent train step, ``continue-from``). With ``evaluation.heldout`` the tokenizer
    and the training sources' tokenize steps carry the split (:mod:`tidal.data.heldout`) and the
    train step also reads those tokenize steps, for their held-out part (``heldout_data``). With
    ``evaluation.downstream`` an ``eval`` step reads the train step and the tokenizer (:func:`eval_step`).
    With ``suite`` the grid's train steps replace ``train`` (and ``eval``) and the ``fit`` step reads them.

    Each kind's planning function (:attr:`tidal.kinds.KindSpec.plan`, :mod:`tidal.core.plans`) builds its
    steps from the recipe and the steps planned before it, and parses each config into the kind's model.

    Args:
        continuation: resolves ``train.continue_from`` against the storage root
            (:func:`tidal.core.continuation.resolve_continuation`, what :class:`tidal.core.pipeline.Pipeline`
            passes); needed only by a recipe that continues a run.

    Raises:
        RecipeError: the recipe continues a run and no ``continuation`` was given, or it refuses it; a
            planned config its kind's model refuses (naming the step and the field).
    """
    planning = Planning(recipe, continuation, suite)
    for spec in KINDS.values():
        if spec.plan is not None:  # test kinds plan nothing
            planning.steps.update((step.name, step) for step in spec.planner()(planning))
    return StepGraph(tuple(planning.steps.values()))


def build_suite_graph(suite: Suite, base: Recipe) -> StepGraph:
    """The suite's steps: the base recipe's data steps (same ids), one train step per grid
    point, then the ``fit`` step reading every train step (the base recipe's eval step is left out)."""
    return build_graph(base, suite=suite)


def train_step_names(graph: StepGraph) -> list[str]:
    """Names of the grid's train steps (what the DAG maps over)."""
    return [s.name for s in graph if s.kind == "train"]


__all__ = ["Continuation", "build_graph", "build_suite_graph", "eval_step", "train_step_names"]
