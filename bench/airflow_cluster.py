"""Benchmark: a recipe through Airflow in production shape, each Celery worker on a node of its own.

    .venv/bin/python bench/airflow_cluster.py [--recipe tiny|slice] [--no-kill]

Starts the test cluster (tests/cluster/harness.py: the loopback S3 server, PostgreSQL, the MLflow
server) and Airflow on it (tests/cluster/airflow_cluster.py: scheduler, dag-processor, api-server and
triggerer on a PostgreSQL database of their own, CeleryExecutor on Redis, two Celery workers each
in a node with private disks), with an ``s3://`` storage root. Then, in one run of this script:

1. ``first``: the recipe's DAG on an empty root, uninterrupted: every step computes.
2. ``cached``: the same DAG again: every step is committed, the plan task skips them all.
3. ``killed`` (unless ``--no-kill``): the DAG with ``seed`` overridden, so that training computes a
   new step; the node of the worker running ``train`` is lost (SIGKILL) 8 s into the task and a
   fresh node with the same name boots; the run must still succeed (try 2 of train).

Prints a line per task of the first run (state, worker, seconds in Airflow vs seconds in the step)
and::

    RESULT executor=CeleryExecutor workers=2 first_run_s=… cached_rerun_s=… cached_ratio=…
           task_overhead_s=… killed_worker_recovered=true|false assets_emitted=…

``cached_ratio`` = cached_rerun_s / first_run_s (the aim: at most 0.05). ``task_overhead_s`` is
the median, over the first run's step tasks, of a task's duration in Airflow (worker process start,
DAG parse, recipe load, task SDK round trips) minus the seconds the step itself reports.
``assets_emitted``: asset events of the first run (one per committed step expected). Exit 1
if any run fails or the kill was not recovered. Needs root and ``make services``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import scenario as sc
from tests.cluster.airflow_cluster import AirflowCluster, seconds_between
from tests.cluster.harness import Cluster


def _recipe(which: str, tmp: Path) -> tuple[str, str]:
    """(name, text) of the benchmarked recipe: recipes/tiny.yaml as it is, or its CI slice."""
    text = sc.slice_recipe(tmp, "tiny_afb", sources=None) if which == "slice" else sc.tiny_recipe_text("tiny_afb")
    return "tiny_afb", text


def main() -> int:
    """Run the three DAG runs and print the per-task lines and the RESULT line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=("tiny", "slice"), default="tiny",
                        help="recipes/tiny.yaml (default) or the CI slice of it (tests/e2e/slices.py)")
    parser.add_argument("--no-kill", action="store_true", help="skip the run that loses a worker's node")
    args = parser.parse_args()
    tmp = sc.bench_workdir("airflow-cluster-")
    if tmp is None:
        return 1
    name, text = _recipe(args.recipe, tmp)
    dag_id = f"tidal_{name}"
    with Cluster.start(tmp / "cluster") as cluster:
        cluster.env["TIDAL_STORAGE_ROOT"] = f"s3://tidal/bench-af-{uuid.uuid4().hex[:8]}"
        with AirflowCluster.start(cluster, tmp / "airflow", {name: text}) as af:
            af.wait_dag(dag_id)
            print(f"bench: Airflow UI {af.url} (admin / {af.password}); logs in {af.workdir}", flush=True)
            runs, recovered = {}, None
            for run_id, conf in (("first", {}), ("cached", {})):
                af.trigger(dag_id, run_id, conf)
                runs[run_id] = af.wait_run(dag_id, run_id, timeout_s=3600)
                took = seconds_between(runs[run_id])
                print(f"bench: run {run_id}: {runs[run_id]['state']} in {took:.1f} s", flush=True)
            tis = af.task_instances(dag_id, "first")
            overheads = []
            for task_id, ti in sorted(tis.items(), key=lambda kv: kv[1].get("start_date") or ""):
                step_s = None
                if ti["state"] == "success" and task_id not in ("plan",):
                    value = af.xcom(dag_id, "first", task_id)
                    step_s = value.get("seconds") if isinstance(value, dict) else None
                took = seconds_between(ti)
                if isinstance(step_s, int | float):
                    overheads.append(took - step_s)
                print(f"task {task_id:<24} {ti['state']:<8} {ti.get('hostname') or '-':<9} {took:7.1f} s in Airflow"
                      + (f", {step_s:7.1f} s in the step" if isinstance(step_s, int | float) else ""))
            assets = len(af.asset_events(dag_id, "first"))
            if not args.no_kill:
                af.trigger(dag_id, "killed", {"seed": 7})
                ti = af.wait_running(dag_id, "killed", "train", timeout_s=1800)
                time.sleep(8)
                af.kill_worker(ti["hostname"])
                af.start_worker(ti["hostname"])
                run = af.wait_run(dag_id, "killed", timeout_s=3600)
                train = af.task_instances(dag_id, "killed")["train"]
                recovered = run["state"] == "success" and train["try_number"] >= 2
                print(f"bench: run killed: {run['state']} in {seconds_between(run):.1f} s; "
                      f"train try {train['try_number']} on {train.get('hostname')} (lost: {ti['hostname']})",
                      flush=True)
    first_s, cached_s = seconds_between(runs["first"]), seconds_between(runs["cached"])
    ok = all(r["state"] == "success" for r in runs.values()) and recovered is not False
    print(f"RESULT executor=CeleryExecutor workers=2 first_run_s={first_s:.1f} cached_rerun_s={cached_s:.1f} "
          f"cached_ratio={cached_s / max(first_s, 1e-9):.3f} "
          f"task_overhead_s={statistics.median(overheads) if overheads else float('nan'):.2f} "
          f"killed_worker_recovered={'skipped' if recovered is None else str(recovered).lower()} "
          f"assets_emitted={assets} recipe={args.recipe} tasks_timed={len(overheads)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
