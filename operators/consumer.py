"""A recipe's checkpoint DAG: runs when its train step commits, finds checkpoints from the bucket.

``tidal_<recipe>__checkpoints`` is scheduled on the recipe's train asset alias
(:func:`operators.assets.checkpoint_alias`). Airflow may merge the events of tasks that finish
together into one run, or a run may be missed while the DAG is paused, so its task does not trust
the triggering events: it reads the run plans the recipe's DAG runs wrote to the bucket
(tidal/audit/catalog.py), keeps the planned train steps that are committed, verifies each against
its manifest, and writes the catalog to ``checkpoints/<recipe>.json`` in the storage root.

A recipe with ``evaluation.downstream`` is also this DAG's evaluation: its ``evaluate`` task, after the
catalog, runs the eval step of each permanent checkpoint and of the final one (committed ones are
skipped, so each run evaluates only checkpoints new since the last) and logs their results per
checkpoint step into one MLflow run per train step (tidal/core/checkpoint_evals.py).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, BaseOperator

from operators.assets import checkpoint_alias
from operators.dag_args import SCHEDULE_START
from operators.run_context import export_signing_key

__all__ = ["CATALOG_TASK_ID", "EVALUATE_TASK_ID", "CheckpointCatalogOperator", "CheckpointEvalOperator",
           "checkpoint_dag", "checkpoint_dag_id"]

CATALOG_TASK_ID = "catalog"
EVALUATE_TASK_ID = "evaluate"


def checkpoint_dag_id(recipe_name: str) -> str:
    """``tidal_<recipe>__checkpoints``."""
    return f"tidal_{recipe_name}__checkpoints"


class CheckpointCatalogOperator(BaseOperator):
    """List and verify the recipe's committed checkpoints (from storage) and write the catalog.

    Fails (so on-call sees it) when a committed checkpoint does not verify, naming it and its first
    mismatches. Returns (XCom): ``{"checkpoints": [...] (tidal.audit.catalog.committed_steps),
    "triggering_events": n, "catalog": uri}``.
    """

    template_fields = ("recipe_path",)
    ui_color = "#d9f2d9"

    def __init__(self, *, recipe_path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recipe_path = recipe_path

    def execute(self, context: Any) -> dict[str, Any]:
        import json

        from airflow.sdk.exceptions import AirflowFailException

        from tidal.audit.catalog import committed_steps
        from tidal.core.load import load_pipeline
        from tidal.integrity.signing import load_key

        export_signing_key()
        pipe = load_pipeline(self.recipe_path)
        events = context.get("triggering_asset_events") or {}
        n_events = sum(len(list(evs)) for evs in events.values()) if hasattr(events, "values") else 0
        found = committed_steps(pipe.storage, pipe.recipe.name, "train", key=load_key())
        for entry in found:
            self.log.info("checkpoint %s step %s root %s: %s", entry["step_id"], entry.get("checkpoint_step"),
                          str(entry.get("checkpoint_root_hash"))[:12], "verified" if entry["verified"] else
                          "MISMATCH " + "; ".join(entry["mismatches"]))
        doc = {"recipe": pipe.recipe.name, "checkpoints": found}
        uri = pipe.storage.write_object(f"checkpoints/{pipe.recipe.name}.json",
                                        (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
        self.log.info("%d committed checkpoint(s) of %s from storage (%d triggering event(s)); catalog %s",
                      len(found), pipe.recipe.name, n_events, uri)
        bad = [e["step_id"] for e in found if not e["verified"]]
        if bad:
            raise AirflowFailException(f"committed checkpoints that do not verify: {bad} (see the log)")
        return {"checkpoints": found, "triggering_events": n_events, "catalog": uri}


class CheckpointEvalOperator(BaseOperator):
    """Evaluate the recipe's permanent and final checkpoints (eval steps, committed through the bucket)
    and log the curve: :func:`tidal.core.checkpoint_evals.evaluate_checkpoints`.

    Returns (XCom): its result (``train``, ``evaluated``, ``skipped``, ``points``, ``curve_run``).
    """

    template_fields = ("recipe_path",)
    ui_color = "#d9e6f2"

    def __init__(self, *, recipe_path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recipe_path = recipe_path

    def execute(self, context: Any) -> dict[str, Any]:
        from tidal.core.load import load_pipeline

        export_signing_key()
        out = load_pipeline(self.recipe_path).evaluate_checkpoints()
        self.log.info("checkpoints of %s evaluated: %d now, %d committed before; curve points %s (MLflow run %s)",
                      out["train"], len(out["evaluated"]), len(out["skipped"]), out["points"], out["curve_run"])
        return out


def checkpoint_dag(recipe: Any, recipe_path: str) -> DAG:
    """The checkpoint DAG of a recipe with a train step (see the module docstring)."""
    with DAG(
        auto_register=False,
        dag_id=checkpoint_dag_id(recipe.name),
        description=f"committed checkpoints of recipe {recipe.name}, verified, when its train step commits",
        schedule=checkpoint_alias(recipe.name),
        start_date=SCHEDULE_START,
        catchup=False,
        max_active_runs=1,
        tags=["tidal", f"recipe:{recipe.name}", "checkpoints"],
        doc_md=(f"Runs when a `train` step of recipe `{recipe.name}` commits (asset alias "
                f"`{checkpoint_alias(recipe.name).name}`). Finds the recipe's committed checkpoints from the "
                "run plans in the bucket, not from the triggering events, verifies them and writes "
                f"`checkpoints/{recipe.name}.json` in the storage root; with downstream evaluation, "
                "evaluates each permanent and the final checkpoint and logs the curve to MLflow."),
    ) as dag:
        catalog = CheckpointCatalogOperator(task_id=CATALOG_TASK_ID, recipe_path=recipe_path)
        if recipe.evaluation.downstream is not None:
            catalog >> CheckpointEvalOperator(task_id=EVALUATE_TASK_ID, recipe_path=recipe_path)
    return dag
