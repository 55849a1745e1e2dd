"""Benchmark: how long Airflow's DagBag takes to parse dags/pretrain.py.

Baseline, measured in the same run: a one-task DAG file using the same Airflow imports.
Prints ``RESULT cold_parse_s=... cold_baseline_s=... warm_parse_s=... warm_baseline_s=...``:
cold is the first parse in a fresh process after ``import airflow.sdk`` (what a new
dag-processor child pays: our modules are imported), warm the median of N re-parses.
Then every file in ``dags/`` on its own: its cold and warm parse time against the 0.3 s per
file target (issue 7), as ``max_file_cold_s``, ``max_file_warm_s`` and ``files_under_target``.

    .venv/bin/python bench/dag_parse.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.3  # issue 7: each DAG file parses in under 0.3 s
BASELINE = '''
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
with DAG(dag_id="baseline", schedule=None) as dag:
    EmptyOperator(task_id="noop")
'''


def parse_seconds(path: Path) -> float:
    from airflow.dag_processing.dagbag import DagBag

    started = time.perf_counter()
    bag = DagBag(dag_folder=str(path), safe_mode=False)
    elapsed = time.perf_counter() - started
    if bag.import_errors or not bag.dags:
        raise SystemExit(f"{path}: parse failed: {bag.import_errors}")
    return elapsed


def cold_seconds(path: Path) -> float:
    """First parse of ``path`` in a fresh interpreter that has imported airflow.sdk only."""
    import subprocess
    import sys

    code = (
        f"import sys, time; import airflow.sdk; sys.path.insert(0, {str(REPO)!r})\n"
        f"from bench.dag_parse import parse_seconds\nprint(parse_seconds(__import__('pathlib').Path({str(path)!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import airflow.sdk  # noqa: F401  (import cost is Airflow's, paid once per dag-processor)

    with tempfile.TemporaryDirectory() as tmp:
        baseline_file = Path(tmp) / "baseline_dag.py"
        baseline_file.write_text(BASELINE)
        ours_file = REPO / "dags" / "pretrain.py"
        cold_base = statistics.median(cold_seconds(baseline_file) for _ in range(3))
        cold_ours = statistics.median(cold_seconds(ours_file) for _ in range(3))
        parse_seconds(baseline_file)
        parse_seconds(ours_file)
        base = statistics.median(parse_seconds(baseline_file) for _ in range(args.repeats))
        ours = statistics.median(parse_seconds(ours_file) for _ in range(args.repeats))
        per_file = {}
        for dag_file in sorted((REPO / "dags").glob("*.py")):
            cold = statistics.median(cold_seconds(dag_file) for _ in range(3))
            warm = statistics.median(parse_seconds(dag_file) for _ in range(args.repeats))
            per_file[dag_file.name] = (cold, warm)
            print(f"{dag_file.name}: cold {cold:.4f} s, warm {warm:.4f} s (target {TARGET_S} s)")
    max_cold = max(c for c, _ in per_file.values())
    max_warm = max(w for _, w in per_file.values())
    under = sum(c < TARGET_S for c, _ in per_file.values())
    print(
        f"RESULT cold_parse_s={cold_ours:.4f} cold_baseline_s={cold_base:.4f} "
        f"warm_parse_s={ours:.4f} warm_baseline_s={base:.4f} cold_ratio={cold_ours / cold_base:.2f} "
        f"max_file_cold_s={max_cold:.4f} max_file_warm_s={max_warm:.4f} target_s={TARGET_S} "
        f"files_under_target={under}/{len(per_file)}"
    )


if __name__ == "__main__":
    main()
