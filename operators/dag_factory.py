"""Build one Airflow DAG per recipe: one task per step, dependencies from the step graph.

Kept light for the dag-processor: it reads YAML and plans the graph (pydantic only); no
Beam, JAX, GX or MLflow import happens while parsing.
"""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG, Param

from operators.step import TidalReportOperator, TidalStepOperator


def build_dag(recipe_path: Path) -> DAG:
    """The DAG ``tidal_{recipe.name}`` for one recipe file.

    Raises:
        tidal.recipe.RecipeError: the recipe is invalid (Airflow shows it as an import error).
    """
    from tidal.planner import build_graph
    from tidal.recipe import load_recipe
    from tidal.scaling.suite import is_suite_file

    if is_suite_file(recipe_path):  # `kind: scaling_suite`: grid DAG (operators/suite_factory.py)
        from operators.suite_factory import build_suite_dag

        return build_suite_dag(Path(recipe_path))
    recipe = load_recipe(recipe_path)
    graph = build_graph(recipe)
    with DAG(
        dag_id=f"tidal_{recipe.name}",
        description=recipe.description or f"tidal recipe {recipe.name}",
        schedule=None,
        catchup=False,
        max_active_runs=1,
        tags=["tidal", f"recipe:{recipe.name}"],
        doc_md=f"Recipe `{recipe_path.name}` v{recipe.version}. Steps are content-addressed: "
        "committed steps are skipped, so clearing a failed task redoes only missing work.",
        params={
            "force_steps": Param(
                [], type="array", items={"type": "string", "enum": [s.name for s in graph]},
                description="steps to recompute even if committed",
            ),
        },
    ) as dag:
        tasks = {
            step.name: TidalStepOperator(
                task_id=step.name, recipe_path=str(recipe_path), step_name=step.name,
                doc_md=f"step `{step.step_id}` ({step.kind})",
            )
            if not (step.kind == "train" and recipe.train.resources.launcher == "gke")
            else _gke_train_group(step=step, recipe=recipe, recipe_path=str(recipe_path))
            for step in graph
        }
        for step in graph:
            for dep in step.inputs:
                tasks[dep.name] >> tasks[step.name]
        report = TidalReportOperator(task_id="report", recipe_path=str(recipe_path))
        list(tasks.values()) >> report
    return dag


def _gke_train_group(**kwargs):
    """The training step as a GKE task group (operators/gke.py); imported only when a recipe asks."""
    from operators.gke import gke_train_group

    return gke_train_group(**kwargs)


def build_dags(recipes_dir: Path) -> dict[str, DAG]:
    """Every ``*.yaml`` recipe in ``recipes_dir`` as ``{dag_id: DAG}``."""
    dags = {}
    for path in sorted(recipes_dir.glob("*.yaml")):
        dag = build_dag(path)
        dags[dag.dag_id] = dag
    return dags
