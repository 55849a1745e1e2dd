"""Which run a command means: the newest run of a recipe (overrides or not), or the one a ``--run-key`` names,
refused with the nearest keys when no such run exists (``tidal report``; issue 44).

A run is known by its plan in the storage root (``runs/<recipe>/<key>.json``, :func:`tidal.audit.catalog.
write_run_plan`, written by ``tidal run`` and the DAG's plan task) or by its MLflow parent run (tag
``tidal.run_key``). The newest is MLflow's newest parent run of the recipe's experiment, whatever overrides it
ran with (a run of the recipe as written is not preferred: ``--help`` says "the newest run").
"""

from __future__ import annotations

import difflib
from typing import Any

from tidal.audit.catalog import recipe_plans
from tidal.config import RecipeError
from tidal.tracking import TrackingUnavailable, parent_run, store_exists
from tidal.tracking.runs import TrackedRun, parent_runs_with_prefix

NEAREST = 3


def _runs(pipe: Any) -> list[TrackedRun]:
    """The recipe's MLflow parent runs, newest first (none when there is no store or MLflow does not answer)."""
    if not store_exists(pipe.tracking_uri):
        return []
    try:
        return parent_runs_with_prefix(pipe.tracking_uri, pipe.experiment, "")
    except (TrackingUnavailable, ValueError):
        return []


def known_run_keys(pipe: Any) -> list[str]:
    """Every run key of ``pipe``'s recipe: MLflow's newest first, then plans only the storage root has (sorted)."""
    keys = [r.run_key for r in _runs(pipe) if r.run_key]
    planned = sorted(str(p.get("run_key")) for p in recipe_plans(pipe.storage, pipe.recipe.name) if p.get("run_key"))
    return list(dict.fromkeys([*keys, *planned]))


def newest_run(pipe: Any) -> TrackedRun | None:
    """The newest MLflow parent run of ``pipe``'s recipe, or None (no store, no run, MLflow unreachable)."""
    if not store_exists(pipe.tracking_uri):
        return None
    try:
        return parent_run(pipe.tracking_uri, pipe.experiment, None)
    except (TrackingUnavailable, ValueError):
        return None


def check_run_key(pipe: Any, run_key: str) -> None:
    """Refuse a ``run_key`` that names no run of ``pipe``'s recipe.

    Raises:
        RecipeError: one line naming the recipe, the key and the nearest known keys (difflib's ratio, then the
            newest), or saying that the recipe has no run yet.
    """
    keys = known_run_keys(pipe)
    if run_key in keys:
        return
    if not keys:
        raise RecipeError(f"recipe {pipe.recipe.name} has no run yet (no plan under {pipe.storage.uri}/runs/, no "
                          f"MLflow run in {pipe.experiment}), so no run key {run_key!r}; run it first")
    nearest = difflib.get_close_matches(run_key, keys, n=NEAREST, cutoff=0.3) or keys[:NEAREST]
    raise RecipeError(f"recipe {pipe.recipe.name} has no run with key {run_key!r}; nearest: {', '.join(nearest)} "
                      f"({len(keys)} run(s) known; without --run-key the newest is shown)")
