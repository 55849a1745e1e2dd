"""``make cluster-demo``: the tiny recipe through Airflow in production shape, on one machine.

    .venv/bin/python -m tests.cluster.demo [--recipe tiny|slice] [--hold SECONDS]

What starts (each server in its own process group, stopped by that group at the end):

* the test cluster's shared services (tests/cluster/harness.py): the loopback S3 server with the
  bucket ``tidal``, PostgreSQL (from ``make services``) and the MLflow server (backend store on
  PostgreSQL, artifacts proxied into the bucket);
* Airflow (tests/cluster/airflow_cluster.py): scheduler, dag-processor, api-server and triggerer on
  a PostgreSQL database of their own, CeleryExecutor on Redis, and two Celery workers, each booted
  in a node of its own (private /tmp, caches and storage cache; its own hostname), so that every
  task runs on whichever worker takes it and the tasks share only the bucket, PostgreSQL and MLflow.

It triggers the recipe's DAG on an ``s3://`` root, prints progress and the URLs of the Airflow UI,
the on-call page and MLflow, waits ``--hold`` seconds (default: until Enter, when stdin is a
terminal; 0 otherwise) so that they can be opened, then stops everything. Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

from tests.cluster import scenario as sc
from tests.cluster.airflow_cluster import AirflowCluster
from tests.cluster.harness import Cluster, ClusterUnavailable

NAME = "tiny"


def _recipe_text(which: str, tmp: Path) -> str:
    return sc.slice_recipe(tmp, NAME, sources=None) if which == "slice" else sc.tiny_recipe_text(NAME)


def _progress(af: AirflowCluster, dag_id: str, run_id: str, timeout_s: float) -> dict:
    """Poll the run, printing each task's state change, until it ends; returns the DAG run."""
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for task_id, ti in af.task_instances(dag_id, run_id).items():
            state = ti["state"] or "none"
            if seen.get(task_id) != state:
                seen[task_id] = state
                where = f" on {ti['hostname']}" if ti.get("hostname") else ""
                print(f"  {time.strftime('%H:%M:%S')} {task_id:<24} {state}{where}", flush=True)
        run = af.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}").json()
        if run["state"] in ("success", "failed"):
            return run
        time.sleep(3)
    raise TimeoutError(f"{dag_id} {run_id} did not finish in {timeout_s} s; logs in {af.workdir}")


def main(argv: list[str] | None = None) -> int:
    """Start, run the recipe, print the URLs, hold, stop; exit 0 when the DAG run succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=("tiny", "slice"), default="tiny",
                        help="recipes/tiny.yaml (default) or its CI slice (a few minutes less)")
    parser.add_argument("--hold", type=float, default=None,
                        help="seconds to keep everything up after the run (default: until Enter on a terminal)")
    args = parser.parse_args(argv)
    tmp = sc.bench_workdir("cluster-demo-")
    if tmp is None:
        return 1
    text = _recipe_text(args.recipe, tmp)
    dag_id = f"tidal_{NAME}"
    print(f"cluster-demo: starting the test cluster and Airflow (logs under {tmp})", flush=True)
    try:
        cluster = Cluster.start(tmp / "cluster")
    except ClusterUnavailable as err:
        print(f"error: cluster-demo: {err}", file=sys.stderr)
        return 1
    with cluster:
        root = f"s3://tidal/demo-{uuid.uuid4().hex[:8]}"
        cluster.env["TIDAL_STORAGE_ROOT"] = root
        with AirflowCluster.start(cluster, tmp / "airflow", {NAME: text}) as af:
            af.wait_dag(dag_id)
            print(f"cluster-demo: Airflow UI   {af.url}/dags/{dag_id}  (login admin / {af.password})\n"
                  f"cluster-demo: on-call page {af.url}/tidal-oncall/\n"
                  f"cluster-demo: MLflow       {cluster.mlflow_uri}\n"
                  f"cluster-demo: storage root {root} (S3 endpoint {cluster.s3_endpoint})\n"
                  f"cluster-demo: workers      {', '.join(af.workers)} (one node each)", flush=True)
            run_id = f"demo-{time.strftime('%Y%m%dT%H%M%S')}"
            af.trigger(dag_id, run_id)
            tick = time.monotonic()
            run = _progress(af, dag_id, run_id, timeout_s=3600)
            print(f"cluster-demo: run {run_id} {run['state']} in {time.monotonic() - tick:.0f} s", flush=True)
            _hold(args.hold)
    print("cluster-demo: stopped every process group it started", flush=True)
    return 0 if run["state"] == "success" else 1


def _hold(seconds: float | None) -> None:
    if seconds is None:
        if not sys.stdin.isatty():
            return
        try:
            input("cluster-demo: press Enter to stop everything ")
        except (EOFError, KeyboardInterrupt):
            pass
        return
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
