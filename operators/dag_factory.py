"""Build one Airflow DAG per recipe: one task per step, dependencies from the step graph.

Kept light for the dag-processor: it reads YAML and plans the graph (pydantic only); no
Beam, JAX, GX or MLflow import happens while parsing.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from airflow.sdk import DAG
from airflow.task.trigger_rule import TriggerRule

from operators.assets import step_alias
from operators.consumer import checkpoint_dag, checkpoint_dag_id
from operators.dag_args import SCHEDULE_START, pipeline_dag_args
from operators.plan import PLAN_TASK_ID, TidalPlanOperator
from operators.step import BrokenRecipeOperator, TidalReportOperator, TidalStepOperator
from operators.suite_factory import build_suite_dag
from tidal.core.planner import build_graph
from tidal.recipe import RecipeError, load_recipe
from tidal.recipe.loader import one_owner_error, read_yaml, recipe_name
from tidal.scaling.suite import is_suite_file
from tidal.steps import CommittedStep

__all__ = ["SCHEDULE_START", "broken_recipe_dag", "build_dag", "build_dags", "pipeline_dag_args", "recipe_doc_md"]

log = logging.getLogger(__name__)


def recipe_doc_md(recipe, recipe_path: Path, graph) -> str:
    """The DAG's docs: the recipe's description, schedule, baseline and its step graph as a table."""
    lines = [
        f"### Recipe `{recipe.name}` v{recipe.version} (`{recipe_path.name}`)",
        "",
        recipe.description or "(no description in the recipe)",
        "",
        f"**Schedule:** {recipe.schedule or 'manual trigger only'}"
        + (f" &nbsp; **Baseline:** `{recipe.baseline.file}` (loss tolerance {recipe.baseline.loss_tolerance}, "
           f"stats tolerance {recipe.baseline.stats_tolerance})" if recipe.baseline else ""),
        "",
        ("Steps are content-addressed: committed steps are skipped, so clearing a failed task redoes only "
        "missing work. Ids below are the recipe as written; trigger-form overrides change some of them."),
        "",
        "| step | kind | step id | reads |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{s.name}` | {s.kind} | `{s.step_id}` | {', '.join(f'`{d.name}`' for d in s.inputs) or '-'} |"
              for s in graph]
    return "\n".join(lines)


def build_dag(recipe_path: Path) -> DAG:
    """The DAG ``tidal_{recipe.name}`` for one recipe file.

    Raises:
        tidal.recipe.RecipeError: the recipe is invalid (Airflow shows it as an import error).
    """
    if is_suite_file(recipe_path):  # `kind: scaling_suite`: grid DAG (operators/suite_factory.py)
        return build_suite_dag(Path(recipe_path))
    recipe = load_recipe(recipe_path)
    if recipe.train.continue_from is None:
        graph = build_graph(recipe)
    else:  # the parent train step's id and checkpoint hash are read from the storage root
        from tidal.core.pipeline import Pipeline

        graph = Pipeline.load(recipe_path).graph
    beam_kinds: tuple[str, ...] = ()
    if recipe.beam.launcher == "provider":  # tidal.core.beam_job imports the runner: only when needed
        from tidal.kinds import BEAM_KINDS as beam_kinds
    # auto_register=False: a DAG whose building fails half-way must not be registered (the
    # DagBag would pick it up from the with-block); build_dags returns the finished ones
    with DAG(
        auto_register=False,
        **pipeline_dag_args(graph, recipe),
        dag_id=f"tidal_{recipe.name}",
        description=recipe.description or f"tidal recipe {recipe.name}",
        tags=["tidal", f"recipe:{recipe.name}"] + (["scheduled"] if recipe.schedule else []),
        doc_md=recipe_doc_md(recipe, Path(recipe_path), graph),
    ) as dag:
        tasks = {
            step.name: TidalStepOperator(
                task_id=step.name, recipe_path=str(recipe_path), step_name=step.name,
                doc_md=f"step `{step.step_id}` ({step.kind})", outlets=[step_alias(recipe.name, step.name)],
            )
            if not (step.kind == "train" and recipe.train.resources.launcher == "gke")
            and step.kind not in beam_kinds or isinstance(step, CommittedStep)  # read here, never computed
            else _remote_group(step=step, recipe=recipe, recipe_path=str(recipe_path))
            for step in graph
        }
        for step in graph:
            for dep in step.inputs:
                tasks[dep.name] >> tasks[step.name]
        # committed steps are skipped by the scheduler, without a worker each (operators/plan.py)
        entry = {name: _entry_tasks(task) for name, task in tasks.items()}
        for roots in entry.values():
            for root in roots:
                root.trigger_rule = TriggerRule.NONE_FAILED  # an input skipped (committed) is no reason to skip
        plan = TidalPlanOperator(task_id=PLAN_TASK_ID, recipe_path=str(recipe_path),
                                 entry_tasks={name: [t.task_id for t in roots] for name, roots in entry.items()})
        plan >> list(tasks.values())
        report = TidalReportOperator(task_id="report", recipe_path=str(recipe_path))
        list(tasks.values()) >> report
    return dag


def _entry_tasks(task_or_group) -> list:
    """The tasks that start a step: its task, or the roots of its task group."""
    roots = getattr(task_or_group, "roots", None)
    return list(roots) if roots is not None else [task_or_group]


def _gke_train_group(**kwargs):
    """The training step as a GKE task group (operators/gke.py); imported only when a recipe asks."""
    from operators.gke import gke_train_group

    return gke_train_group(**kwargs)


def _remote_group(*, step, **kwargs):
    """A step run elsewhere, as a task group: training on GKE, or a Beam job (operators/beam.py)."""
    if step.kind == "train":
        return _gke_train_group(step=step, **kwargs)
    from operators.beam import beam_step_group

    return beam_step_group(step=step, **kwargs)


def build_dags(recipes_dir: Path, only: str | None = None) -> dict[str, DAG]:
    """Every ``*.yaml`` recipe in ``recipes_dir`` as ``{dag_id: DAG}``: its pipeline DAG and, for a
    recipe with a train step, its checkpoint DAG ``tidal_<recipe>__checkpoints`` (operators/consumer.py).

    One broken recipe must not hide the others (an exception here would make the whole
    DAG file an import error): an invalid recipe, or a second recipe claiming a DAG id
    already taken, becomes a ``tidal_broken_<file>`` DAG whose doc and only task show the
    error, and the error is logged by the dag-processor. Files sharing one ``name`` are all refused, as one
    broken DAG ``tidal_<name>`` whose description names them (shown on the DAG list) and whose error
    names every file: a winner by file order would run the wrong recipe without a word.

    Args:
        only: the DAG id a task process asks for (Airflow's parsing context,
            ``airflow.sdk.get_parsing_context().dag_id``): the other recipe files are read as YAML
            for their ``name`` only, not validated, planned or built. None (the dag-processor) or a
            broken recipe's DAG id: all.
    """
    if only is not None and only.startswith("tidal_broken_"):
        only = None  # why a file is broken may depend on the others (a DAG id taken by an earlier file)
    dags: dict[str, DAG] = {}
    sources: dict[str, Path] = {}
    paths = sorted(recipes_dir.glob("*.yaml"))
    owners: dict[str, list[Path]] = {}
    for path in paths:  # names only (cheap): a name claimed twice is one broken DAG under that name
        name = recipe_name(path)
        if name is not None:
            owners.setdefault(name, []).append(path)
    shared = {name: files for name, files in owners.items() if len(files) > 1}
    for name, files in shared.items():
        if only is not None and only not in (f"tidal_{name}", checkpoint_dag_id(name)):
            continue
        error = one_owner_error(name, files)
        log.error("recipes %s are broken: %s", ", ".join(map(str, files)), error)
        dags[f"tidal_{name}"] = broken_recipe_dag(files[0], error, dag_id=f"tidal_{name}",
                                                  description=f"broken: recipe name {name!r} is claimed by "
                                                  + " and ".join(p.name for p in files))
    claimed = {p for files in shared.values() for p in files}
    for path in paths:
        if path in claimed or (only is not None and not _may_define(path, only)):
            continue
        try:
            built = [build_dag(path)]
            built += _consumer_dags(path, built[0])
            for dag in built:
                if dag.dag_id in dags:
                    raise ValueError(f"{path}: DAG id {dag.dag_id!r} is already defined by {sources[dag.dag_id]}")
                _check_serializes(dag)
        except Exception as err:  # noqa: BLE001 - any recipe error: show it, keep the other DAGs
            log.error("recipe %s is broken: %s", path, err)
            built = [broken_recipe_dag(path, f"{type(err).__name__}: {err}")]
        for dag in built:
            dags[dag.dag_id] = dag
            sources[dag.dag_id] = path
    return dags


def _consumer_dags(path: Path, dag: DAG) -> list[DAG]:
    """The checkpoint DAG (operators/consumer.py) of a pipeline recipe with a train step."""
    if is_suite_file(path) or not any(t.task_id == "train" or t.task_id.startswith("train.") for t in dag.tasks):
        return []

    return [checkpoint_dag(load_recipe(path), str(path))]


def _may_define(path: Path, dag_id: str) -> bool:
    """Whether the recipe file ``path`` may define ``dag_id`` (``tidal_<name>`` from its top-level
    ``name``); a file that cannot be read so cheaply may."""
    try:
        data = read_yaml(path)
    except RecipeError:
        return True

    name = data.get("name") if isinstance(data, dict) else None
    return not isinstance(name, str) or dag_id in (f"tidal_{name}", checkpoint_dag_id(name))


def broken_dag_id(path: Path) -> str:
    """The DAG id of the recipe file ``path`` when it is broken: ``tidal_broken_<stem>``."""
    return "tidal_broken_" + re.sub(r"[^A-Za-z0-9_]", "_", path.stem)


def _check_serializes(dag: DAG) -> None:
    """Serialize ``dag`` as the dag-processor will, so that a DAG it would refuse becomes a broken-recipe
    DAG here instead of failing the whole file. Only where Airflow's serializer is already loaded
    (the dag-processor, ``airflow dags test``): importing it costs ~4 s, too much for a bare parse."""
    import sys

    module = sys.modules.get("airflow.serialization.serialized_objects")
    if module is not None:
        module.DagSerialization.serialize_dag(dag)


def broken_recipe_dag(path: Path, error: str, dag_id: str | None = None, description: str | None = None) -> DAG:
    """A one-task DAG that shows why ``path`` could not become a pipeline DAG (``dag_id``: default
    ``tidal_broken_<file>``; two files claiming one name get ``tidal_<name>`` itself, so the DAG a user looks
    for says why it is not there)."""
    with DAG(
        auto_register=False,
        dag_id=dag_id or broken_dag_id(path),
        description=description or f"recipe {path.name} is invalid",
        schedule=None,
        catchup=False,
        tags=["tidal", "broken-recipe"],
        doc_md=f"**Recipe `{path}` is invalid; fix it and this DAG is replaced by the pipeline.**\n\n```\n{error}\n```",
    ) as dag:
        BrokenRecipeOperator(task_id="recipe_error", error=error)
    return dag
