"""The trigger form of a recipe DAG: Airflow Params, and how their values become recipe overrides.

Invariant: a trigger-time value reaches the steps only through the recipe's own override
mechanism (:func:`tidal.recipe.load_recipe` with dotted overrides), so it is validated by the
same pydantic model as the YAML and changes a step id exactly where it changes what the step
computes: ``seed`` (mix, train and their descendants), ``train_steps`` (train only). The
resource profile (offered by a DAG whose recipe trains with the gke launcher only: a DAG's train task runs
the launcher it was built for, so the form offers no launcher) goes to ``train.resources``, which the planner
never hashes; ``force_steps`` (optional: its schema allows null, so the form shows no required star) and
``dry_run`` are run options, not recipe fields. Only values that differ
from the recipe become overrides, so a run with the form's defaults is the recipe as written
(same step ids, same recipe hash).

Each Param carries a JSON schema (types, bounds, enums); Airflow validates a trigger's conf
against it in the UI form and in ``POST /api/v2/dags/{dag_id}/dagRuns`` and refuses invalid
values (HTTP 400) before a run exists.
"""

from __future__ import annotations

from typing import Any

# Bounds mirror tidal/recipe/schema.py: seed is a non-negative int (Recipe.seed, ge=0; 2**63-1 is the
# largest int JSON schema validators and numpy seeds agree on); train.steps is a PositiveInt.
# The upper bound on steps is a guard against typos (1e7 steps is far beyond any tidal recipe).
SEED_MAX = 2**63 - 1
TRAIN_STEPS_MAX = 10_000_000
LAUNCHERS = ("local", "gke")
PROFILED_LAUNCHERS = ("gke",)  # the launchers whose DAGs offer resource profiles (local runs on this machine)
# Named train.resources shapes (not hashed: where and how fast, never what). They match the
# golden pod specs in tests/launch/golden/ and the hardware table in tidal/launch/resources.py.
# "recipe" keeps what the recipe says. They take effect with the gke launcher.
RESOURCE_PROFILES: dict[str, dict[str, Any]] = {
    "recipe": {},
    "cpu-spot": {"accelerator": {"kind": "cpu"}, "spot": True},
    "gpu-h100-8": {"accelerator": {"kind": "gpu", "type": "nvidia-h100-80gb", "count": 8}},
    "tpu-v5e-2x4": {"accelerator": {"kind": "tpu", "type": "tpu-v5-lite-podslice", "topology": "2x4"}},
    "tpu-v5p-2x2x4-multislice": {"accelerator": {"kind": "tpu", "type": "tpu-v5p-slice", "topology": "2x2x4",
                                                 "slices": 2}},
}


def recipe_params(recipe: Any, step_names: list[str]) -> dict[str, Any]:
    """The ``params`` of a recipe's DAG: ``{name: airflow.sdk.Param}`` with defaults from ``recipe``.

    Args:
        recipe: the validated :class:`tidal.recipe.Recipe` the DAG is built from.
        step_names: the names in its step graph (enum of ``force_steps``).
    """
    from airflow.sdk import Param

    launcher = recipe.train.resources.launcher
    form = {
        "seed": Param(recipe.seed, type="integer", minimum=0, maximum=SEED_MAX, title="Seed",
                      description="recipe seed; changes the ids of mix, train and what reads them"),
        "train_steps": Param(recipe.train.steps, type="integer", minimum=1, maximum=TRAIN_STEPS_MAX,
                             title="Training steps", description="train.steps; changes only the train step's id"),
    }
    if launcher in PROFILED_LAUNCHERS:  # the DAG's train task runs only its own launcher: profiles of that one
        form["resource_profile"] = Param("recipe", type="string", enum=list(RESOURCE_PROFILES),
                                         title="Resource profile", description="named train.resources shape for "
                                         f"the {launcher} launcher (not hashed); 'recipe' keeps the recipe's")
    # type null too: Airflow's form marks a field required unless its schema allows null, and "no step" is the
    # usual answer here
    form["force_steps"] = Param([], type=["array", "null"], items={"type": "string", "enum": list(step_names)},
                                uniqueItems=True, title="Steps to force-rerun",
                                description="steps to recompute even if committed (optional)")
    form["dry_run"] = Param(False, type="boolean", title="Dry run",
                            description="plan only: every step logs run/skip/blocked and computes nothing")
    return form


def overrides_from_params(recipe: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Dotted recipe overrides for the run's params: only values that differ from ``recipe``.

    Raises:
        ValueError: an unknown resource profile (the Param enum refuses it first in Airflow).
    """
    overrides: dict[str, Any] = {}
    if "seed" in params and params["seed"] != recipe.seed:
        overrides["seed"] = int(params["seed"])
    if "train_steps" in params and params["train_steps"] != recipe.train.steps:
        overrides["train.steps"] = int(params["train_steps"])
    profile = params.get("resource_profile") or "recipe"
    if profile not in RESOURCE_PROFILES:
        raise ValueError(f"unknown resource profile {profile!r}; known: {sorted(RESOURCE_PROFILES)}")
    if profile != "recipe" and recipe.train.resources.launcher not in PROFILED_LAUNCHERS:
        raise ValueError(f"resource profile {profile!r}: the DAG runs training with the "
                         f"{recipe.train.resources.launcher} launcher, which takes the recipe's resources only")
    for key, value in RESOURCE_PROFILES[profile].items():
        overrides[f"train.resources.{key}"] = value
    return overrides


def run_options(params: dict[str, Any]) -> tuple[set[str], bool]:
    """``(force_steps, dry_run)`` of a run's params."""
    return set(params.get("force_steps") or []), bool(params.get("dry_run", False))
