"""Airflow operators for tidal steps: thin shells that delegate to :mod:`tidal.pipeline`.

Nothing heavy is imported at module level, so DAG files that use these parse fast; the
step's own libraries (Beam, JAX, GX) load inside ``execute`` on the worker.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator


def run_key_of(context: Any) -> str:
    """The MLflow parent-run key of the Airflow DAG run: ``{dag_id}__{run_id}``."""
    dag_run = context["dag_run"]
    return f"{dag_run.dag_id}__{dag_run.run_id}"


class TidalStepOperator(BaseOperator):
    """Run one content-addressed step of a recipe; a committed step is skipped in milliseconds.

    Args:
        recipe_path: the recipe YAML the DAG was built from.
        step_name: the step's name in the recipe's graph (also the task id).

    Trigger-time params read: ``force_steps`` (list of step names to recompute).
    Returns (XCom): ``{"step_id", "status" ("run"|"skip"), "seconds"}``.
    """

    template_fields = ("recipe_path",)
    ui_color = "#cfe8ff"

    def __init__(self, *, recipe_path: str, step_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recipe_path = recipe_path
        self.step_name = step_name

    def execute(self, context: Any) -> dict[str, Any]:
        from tidal.pipeline import Pipeline

        params = context.get("params") or {}
        force = self.step_name in (params.get("force_steps") or [])
        pipe = Pipeline.load(self.recipe_path)
        result = pipe.run(self.step_name, run_key=run_key_of(context), force=force)
        self.log.info("%s %s in %.3f s -> %s", result.status, result.step_id, result.seconds, result.out_dir)
        return {"step_id": result.step_id, "status": result.status, "seconds": round(result.seconds, 3)}


class TidalReportOperator(BaseOperator):
    """Close the DAG run's MLflow parent run and log a summary; runs whatever happened.

    It fails (so the DAG run is marked failed) when any step of the recipe is not
    committed at the end, naming those steps.
    """

    template_fields = ("recipe_path",)
    ui_color = "#e8e8e8"

    def __init__(self, *, recipe_path: str, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.recipe_path = recipe_path

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from tidal.pipeline import Pipeline
        from tidal.report import build_report, format_report

        pipe = Pipeline.load(self.recipe_path)
        report = build_report(pipe, run_key_of(context), finish=True)
        for line in format_report(report).splitlines():
            self.log.info("%s", line)
        if report["missing"]:
            raise AirflowFailException(f"steps not committed: {report['missing']}")
        return {k: v for k, v in report.items() if k in ("steps_run", "steps_skipped", "tokens_seen")}


class BrokenRecipeOperator(BaseOperator):
    """The only task of a broken recipe's DAG: fails with the validation error."""

    ui_color = "#ffb3b3"

    def __init__(self, *, error: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def execute(self, context: Any) -> None:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(self.error)
