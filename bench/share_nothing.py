"""Benchmark: the tiny recipe's slice with every step on fresh nodes that share only the bucket.

    .venv/bin/python bench/share_nothing.py [--scale 1]

Starts the test cluster (tests/cluster/harness.py: nodes in their own mount, UTS and PID
namespaces with private /tmp, caches and storage cache; shared only a moto S3 server, PostgreSQL
and an MLflow server with its artifacts in the bucket) and runs the slice of recipes/tiny.yaml
(tests/e2e/slices.py, ``--scale`` multiplies the documents) with an ``s3://`` root: Beam steps and
training as prepare / launch / commit on three fresh nodes each (as Airflow's KubernetesExecutor
pods would), the other steps as ``tidal run --step`` on one. Each step's nodes reach the bucket
through a counting proxy, so "fetched" is what really crossed the wire (GET bodies). The
baseline, measured in the same run: the same recipe in one process on a local root. Prints a
line per step (seconds, bytes fetched, bytes of its inputs) and

    RESULT nodes=… steps=… identical_to_local=true|false bytes_read_ratio=… wall_ratio_vs_local=…

``identical_to_local``: every data step's manifest root hash equals the local run's; gate and
train outputs carry wall-clock figures (Data Docs times, tokens/s), so for them the gate result,
the parameters' sha256 and the loss curve must be equal (as tests/e2e/test_determinism.py).
``bytes_read_ratio``: bytes fetched from the bucket by all steps over the bytes of their
committed inputs (a step that downloads every input in full scores about 1; reading in place
only what it needs scores below). ``wall_ratio_vs_local``: wall time of the node run over the
local run (every node pays a Python start and the bucket round trips; the local run pays one).
Needs root (namespaces) and PostgreSQL on 127.0.0.1:5432 (``make services``).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import scenario as sc
from tests.cluster.harness import Cluster


def main() -> int:
    """Run the scenario and print the per-step lines and the RESULT line; exit 1 if not identical."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="document slice multiplier (tests/e2e/slices.py)")
    args = parser.parse_args()
    tmp = sc.bench_workdir("share-nothing-")
    if tmp is None:
        return 1
    text = sc.slice_recipe(tmp, scale=args.scale, sources=None)
    steps = sc.step_names(text, tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDAL_STORAGE", "TIDAL_S3", "MLFLOW_", "AWS_"))}
    local_root, local_s = sc.run_local(text, tmp, env)
    with Cluster.start(tmp / "cluster") as cluster:
        root = f"s3://tidal/bench-{uuid.uuid4().hex[:8]}"
        run = sc.run_on_nodes(cluster, text, steps, root=root, run_key="bench")
        differ = sc.differences(cluster, root, local_root, steps)
        inputs = sc.input_bytes(cluster, root, text, tmp)
    identical = not differ
    for name, _, kind in steps:
        print(f"step {name:<18} {kind:<9} {run.per_step[name]:7.1f} s  fetched {run.fetched[name]:>10} B  "
              f"inputs {inputs[name]:>10} B  {differ.get(name, 'same as local')}")
    fetched, needed = sum(run.fetched.values()), sum(inputs.values())
    print(f"RESULT nodes={run.nodes} steps={len(steps)} identical_to_local={str(identical).lower()} "
          f"bytes_read_ratio={fetched / max(needed, 1):.3f} wall_ratio_vs_local={run.seconds / local_s:.2f} "
          f"fetched_bytes={fetched} input_bytes={needed} wall_s={run.seconds:.1f} local_wall_s={local_s:.1f}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
