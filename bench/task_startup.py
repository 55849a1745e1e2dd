"""Benchmark: where an Airflow task's start-up goes, part by part, before the step does any work.

    .venv/bin/python bench/task_startup.py [--repeats 3] [--recipes 10]

A Celery worker forks a task process for every task (Airflow 3's supervisor, then the task runner):
Airflow's own modules are loaded already; the child parses the DAG file, then the operator loads the
recipe's pipeline, imports what the step needs and opens the MLflow store. Each part is timed here
in a fresh interpreter that has imported ``airflow.sdk`` first (as the forked child has), median of
``--repeats``:

- ``interpreter_s``: ``python -c pass`` (wall): what a task pays when it is a new process or pod;
- ``airflow_sdk_import_s``: ``import airflow.sdk`` (paid once per worker when tasks are forked);
- ``dag_parse_all_s``: DagBag of ``dags/`` building every recipe of a folder of ``--recipes`` recipes
  (the parse before this wave: every task built every recipe's DAG);
- ``dag_parse_own_s``: the same with the task's parsing context: only its own recipe is built;
- ``pipeline_load_s``: the operator's :func:`operators.run_context.pipeline_for_run` (recipe, step
  graph, step ids, storage);
- ``mlflow_import_s`` and ``mlflow_sqlite_open_s``: ``import mlflow``, then the first call on a
  SQLite tracking store (schema check and migrations: the local default; an MLflow server costs one
  HTTP round trip instead);
- ``openlineage_off_s`` and ``openlineage_on_s``: the OpenLineage provider's plugin as a task process
  loads it, without a transport (disabled: the listener is not imported) and with one (its listener).

Prints ``RESULT interpreter_s=… airflow_sdk_import_s=… dag_parse_all_s=… dag_parse_own_s=…
parse_own_ratio=… pipeline_load_s=… mlflow_import_s=… mlflow_sqlite_open_s=… openlineage_off_s=… openlineage_on_s=…
recipes=…``; ``parse_own_ratio`` = own / all, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent

PROBES = {
    "airflow_sdk_import_s": "t = time.perf_counter(); import airflow.sdk; dt = time.perf_counter() - t",
    "dag_parse_s": ("import airflow.sdk\nfrom airflow.dag_processing.dagbag import DagBag\n"
                    "t = time.perf_counter(); bag = DagBag(dag_folder=DAGS, safe_mode=False)\n"
                    "dt = time.perf_counter() - t\nassert bag.dags and not bag.import_errors, bag.import_errors"),
    "pipeline_load_s": ("import airflow.sdk\nfrom operators.run_context import pipeline_for_run\n"
                        "t = time.perf_counter()\n"
                        "pipe = pipeline_for_run(RECIPE, {'params': {}}, check_tracking=False)\n"
                        "list(pipe.graph); dt = time.perf_counter() - t"),
    "mlflow_import_s": "import airflow.sdk\nt = time.perf_counter(); import mlflow; dt = time.perf_counter() - t",
    "mlflow_sqlite_open_s": ("import airflow.sdk, mlflow\nfrom mlflow.tracking import MlflowClient\n"
                             "t = time.perf_counter(); MlflowClient(TRACKING).search_experiments()\n"
                             "dt = time.perf_counter() - t"),
    "openlineage_off_s": ("import airflow.sdk\nt = time.perf_counter()\n"
                          "import airflow.providers.openlineage.plugins.openlineage\ndt = time.perf_counter() - t"),
    "openlineage_on_s": ("import airflow.sdk\nt = time.perf_counter()\n"
                         "import airflow.providers.openlineage.plugins.openlineage\ndt = time.perf_counter() - t"),
}


def probe(code: str, env: dict[str, str], consts: dict[str, str]) -> float:
    """Run ``code`` in a fresh interpreter (cwd = the repository); it sets ``dt`` (seconds)."""
    head = f"import sys, time\nsys.path.insert(0, {str(REPO)!r})\n"
    head += "".join(f"{k} = {v!r}\n" for k, v in consts.items())
    out = subprocess.run([sys.executable, "-c", head + code + "\nprint('DT', dt)"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"probe failed:\n{code}\n{out.stderr[-3000:]}")
    return float(next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("DT ")))


def recipes_folder(tmp: Path, count: int) -> Path:
    """``count`` recipes: tiny.yaml and copies of it under other names (a team's folder)."""
    folder = tmp / "recipes"
    folder.mkdir()
    data = yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())
    for i in range(count):
        name = "tiny" if i == 0 else f"tiny_copy{i}"
        (folder / f"{name}.yaml").write_text(yaml.safe_dump({**data, "name": name}, sort_keys=False))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--recipes", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tidal-startup-") as tmp_name:
        tmp = Path(tmp_name)
        folder = recipes_folder(tmp, args.recipes)
        env = {**os.environ, "TIDAL_RECIPES_DIR": str(folder), "AIRFLOW_HOME": str(tmp / "airflow"),
               "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "TIDAL_STORAGE_ROOT": str(tmp / "storage")}
        env.pop("_AIRFLOW_PARSING_CONTEXT_DAG_ID", None)
        own_env = {**env, "_AIRFLOW_PARSING_CONTEXT_DAG_ID": "tidal_tiny"}
        consts = {"DAGS": str(REPO / "dags"), "RECIPE": str(folder / "tiny.yaml"),
                  "TRACKING": f"sqlite:///{tmp / 'mlflow.db'}"}
        figures: dict[str, float] = {}

        walls = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            walls.append(time.perf_counter() - started)
        figures["interpreter_s"] = statistics.median(walls)
        for key, code in PROBES.items():
            if key == "dag_parse_s":
                for name, penv in (("dag_parse_all_s", env), ("dag_parse_own_s", own_env)):
                    figures[name] = statistics.median(probe(code, penv, consts) for _ in range(args.repeats))
                continue
            if key == "openlineage_on_s":  # a transport configured: the plugin loads its listener
                on_env = {**env, "AIRFLOW__OPENLINEAGE__TRANSPORT": '{"type": "console"}'}
                figures[key] = statistics.median(probe(code, on_env, consts) for _ in range(args.repeats))
                print(f"{key:24s} {figures[key]:.3f} s", flush=True)
                continue
            if key == "mlflow_sqlite_open_s":
                probe(code, env, consts)  # the first open creates the schema; a task opens an existing store
            figures[key] = statistics.median(probe(code, env, consts) for _ in range(args.repeats))
            print(f"{key:24s} {figures[key]:.3f} s", flush=True)
        figures["parse_own_ratio"] = figures["dag_parse_own_s"] / figures["dag_parse_all_s"]
    order = ["interpreter_s", "airflow_sdk_import_s", "dag_parse_all_s", "dag_parse_own_s", "parse_own_ratio",
             "pipeline_load_s", "mlflow_import_s", "mlflow_sqlite_open_s", "openlineage_off_s", "openlineage_on_s"]
    print("RESULT " + " ".join(f"{k}={figures[k]:.3f}" for k in order) + f" recipes={args.recipes}")


if __name__ == "__main__":
    main()
