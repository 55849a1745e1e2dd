"""The Beam data steps of a slice on the Flink cluster, through the Beam provider's task group.

Shared by tests/cluster/test_beam_on_flink.py and bench/beam_cluster.py. A slice of the tiny recipe
with ``beam: {launcher: provider, runner: FlinkRunner, pipeline_options: <the cluster's>}`` runs up
to its tokenize steps with an ``s3://`` root: fetch and tokenizer as ``tidal run --step`` on a node
each; every clean and tokenize step as the DAG's task group does it, ``prepare`` (tidal's operator
code), ``launch`` (the command Airflow's ``BeamRunPythonPipelineOperator`` runs: its kwargs from
:func:`operators.beam.beam_operator_kwargs`, templates rendered against the prepare's XCom, options
turned into arguments by the provider's own ``beam_options_to_args``) and ``commit``, each on a fresh
node. The job's workers are the TaskManagers' SDK worker pools on their own nodes.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import scenario as sc
from tests.cluster.flink import FlinkCluster
from tests.cluster.harness import Cluster

BEAM_KINDS = ("clean", "tokenize")
UPSTREAM_KINDS = ("fetch", "tokenizer")


FLINK_SOURCES = ("gcide",)  # the slice's largest source (near duplicates in it): every Beam step kind, 2 Flink jobs


def flink_recipe(tmp: Path, flink: FlinkCluster, *, name: str = "tiny_flink", scale: int = 1,
                 parallelism: int | None = None, sources: tuple[str, ...] | None = FLINK_SOURCES) -> str:
    """A slice recipe whose Beam steps run on ``flink`` through the provider (near-dedup on, as in tiny),
    with only ``sources`` (None: all): each source is a clean and a tokenize job, about 50 s each on 2 cores."""
    data = yaml.safe_load(sc.slice_recipe(tmp, name, scale=scale, sources=sources))
    options: dict[str, Any] = {}
    for arg in flink.args(parallelism):
        key, _, value = arg.removeprefix("--").partition("=")
        if key != "runner":
            options[key] = value if value else True
    data["beam"] = {"launcher": "provider", "runner": "FlinkRunner", "pipeline_options": options}
    for source in data["sources"].values():
        assert source.get("near_dedup", {}).get("enabled", True), "the slice must keep near-dedup on"
    return yaml.safe_dump(data, sort_keys=False)


def data_steps(recipe_text: str, tmp: Path) -> list[tuple[str, str, str]]:
    """``(name, step_id, kind)`` of the slice's steps up to tokenize, in plan order."""
    return [s for s in sc.step_names(recipe_text, tmp) if s[2] in (*UPSTREAM_KINDS, *BEAM_KINDS)]


def launch_command(recipe_text: str, name: str, prepared: dict, tmp: Path) -> list[str]:
    """The argv Airflow's Beam provider runs for the launch task of step ``name``: the operator's kwargs
    (:func:`operators.beam.beam_operator_kwargs`), its Jinja templates rendered against ``prepared``
    (the prepare task's XCom), the provider's ``beam_options_to_args``; the interpreter is the node's."""
    import jinja2
    from airflow.providers.apache.beam.hooks.beam import beam_options_to_args

    from operators.beam import beam_operator_kwargs
    from tidal.core.load import load_pipeline

    path = tmp / f"launch-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(recipe_text)
    pipe = load_pipeline(path, storage_root=str(tmp / "plan-root"))
    kwargs = beam_operator_kwargs(step=pipe.graph[name], recipe=pipe.recipe, prepare_task_id=f"{name}.prepare")

    class TaskInstance:
        def xcom_pull(self, task_ids: str, key: str) -> dict:
            assert (task_ids, key) == (f"{name}.prepare", "prepared"), (task_ids, key)
            return prepared

    def render(value: Any) -> Any:
        if isinstance(value, str):
            return jinja2.Template(value).render(ti=TaskInstance())
        if isinstance(value, list):
            return [render(v) for v in value]
        if isinstance(value, dict):
            return {k: render(v) for k, v in value.items()}
        return value

    variables = {**kwargs["default_pipeline_options"], **render(kwargs["pipeline_options"])}
    variables["labels"] = [f"{k}={v}" for k, v in variables["labels"].items()]  # as the hook does
    return ["python", *kwargs["py_options"], kwargs["py_file"], f"--runner={kwargs['runner']}",
            *beam_options_to_args(variables)]


def run_on_flink(cluster: Cluster, recipe_text: str, steps: list[tuple[str, str, str]], *, root: str, run_key: str,
                 tmp: Path, only: tuple[str, ...] = ()) -> sc.ClusterRun:
    """Every step of ``steps`` on fresh nodes (``only``: just these names, the rest must be committed);
    Beam steps as prepare / launch (on Flink) / commit on three nodes."""
    result = sc.ClusterRun(root, 0.0)
    tick = time.perf_counter()
    for index, (name, _, kind) in enumerate(steps):
        if only and name not in only:
            continue
        start = time.perf_counter()
        if kind in BEAM_KINDS:
            result.outputs[name], result.xcoms[name] = run_task_group(cluster, recipe_text, name, kind, root=root,
                                                                      run_key=run_key, index=index, tmp=tmp)
        else:
            proc = sc.on_node(cluster, f"node-{index}", recipe_text,
                              ["run", "recipe.yaml", "--step", name, "--run-key", run_key], root=root)
            result.outputs[name] = proc.stdout + proc.stderr
        result.per_step[name] = time.perf_counter() - start
    result.seconds = time.perf_counter() - tick
    return result


def run_task_group(cluster: Cluster, recipe_text: str, name: str, kind: str, *, root: str, run_key: str,
                   index: int, tmp: Path, check: bool = True, timeout: float = 900) -> tuple[str, dict]:
    """Step ``name``'s ``prepare`` / ``launch`` (the provider's command, :func:`launch_command`) /
    ``commit`` on three fresh nodes (:func:`tests.cluster.scenario.run_split`). Returns (output, XCom)."""
    return sc.run_split(cluster, recipe_text, name, kind, root=root, run_key=run_key, index=index, check=check,
                        timeout=timeout, launch=lambda prepared: launch_command(recipe_text, name, prepared, tmp))
