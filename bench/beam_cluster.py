"""Benchmark: the clean and tokenize steps in-process and on a Flink cluster of 1 and 2 TaskManagers.

    .venv/bin/python bench/beam_cluster.py [--scale 4] [--memory-scales 4,16]

Starts the test cluster (tests/cluster/harness.py) and on it a standalone Flink cluster
(tests/cluster/flink.py: a JobManager node, TaskManager nodes of one slot each with Beam's Python
SDK worker pool beside them; Flink 1.19.3 and Beam's Flink job server 2.62.0 from
``tools/flink/install.sh``). A slice of the tiny recipe (tests/e2e/slices.py; ``--scale``
multiplies the documents; near-dedup on) runs its steps up to tokenize three times, each on a fresh
``s3://`` root, the Beam steps through the provider's task group (prepare / launch / commit on
three nodes, tests/cluster/beam_scenario.py):

* ``inprocess``: the launch node runs the job on Beam's in-process FnApiRunner (the default);
* ``flink_1tm`` and ``flink_2tm``: ``FlinkRunner`` on one TaskManager (parallelism 1), then on two
  (parallelism 2; a second TaskManager node joins).

Throughput is the clean steps' input (``raw.parquet`` bytes) plus the tokenize steps' input
(document shards) over the seconds of their launch tasks, in MB/s. Prints a line per configuration and

    RESULT runner=FlinkRunner taskmanagers=2 identical=true|false mbps_inprocess=… mbps_flink_1tm=…
           mbps_flink_2tm=… scaling_2tm_vs_1tm=… peak_rss_worker_mb=… staged_bytes_ratio=…

``identical``: every clean and tokenize step of the three runs has the same manifest root hash.
``peak_rss_worker_mb``: the largest resident set of any SDK worker process (sampled every 0.2 s) in
the 2-TaskManager run; with ``--memory-scales A,B`` the 2-TaskManager run is repeated at those scales
and ``peak_rss_worker_mb_A=…`` ``peak_rss_worker_mb_B=…`` are added (flat memory: equal within noise).
``staged_bytes_ratio``: bytes the 2-TaskManager run's Beam jobs wrote to the bucket (outputs,
spill files, checksum records; counted by a proxy in front of it) over the bytes of their committed
outputs. Needs root (namespaces) and PostgreSQL on 127.0.0.1:5432 (``make services``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Self

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import beam_scenario as bs
from tests.cluster import scenario as sc
from tests.cluster.flink import FlinkCluster
from tests.cluster.harness import BUCKET, Cluster
from tests.storage.servers import FaultProxy


class WorkerMemory:
    """Peak RSS of SDK worker processes (``SdkHarness`` in their command line), sampled in a thread."""

    def __init__(self):
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["ps", "-eo", "rss=,args="], check=False, capture_output=True, text=True).stdout
            for line in out.splitlines():
                rss, _, args = line.strip().partition(" ")
                if "SdkHarness" in args:
                    self.peak_kb = max(self.peak_kb, int(rss))
            time.sleep(0.2)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def committed_bytes(cluster: Cluster, root: str, step_id: str) -> int:
    key = f"{root.removeprefix(f's3://{BUCKET}/')}/{step_id}/manifest.json"
    return sum(e["bytes"] for e in json.loads(cluster.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read())["files"])


def measure(cluster: Cluster, text: str, tmp: Path, label: str) -> dict:
    """Run the slice's data steps on a fresh root; the Beam steps' launch seconds, input and output bytes."""
    steps = bs.data_steps(text, tmp)
    root = f"s3://{BUCKET}/bench-{label}-{uuid.uuid4().hex[:6]}"
    upstream = [s for s in steps if s[2] == "fetch"]
    bs.run_on_flink(cluster, text, upstream, root=root, run_key=f"bench-{label}", tmp=tmp)
    run = bs.run_on_flink(cluster, text, steps, root=root, run_key=f"bench-{label}", tmp=tmp,
                          only=tuple(n for n, _, k in steps if k != "fetch"))
    beam = [(n, sid, k) for n, sid, k in steps if k in bs.BEAM_KINDS]
    inputs = sc.input_bytes(cluster, root, text, tmp, names=tuple(n for n, _, _ in beam))
    seconds = sum(run.per_step[n] for n, _, _ in beam)
    moved = sum(inputs[n] for n, _, _ in beam)
    markers = sc.bucket_markers(cluster, root)
    return {"seconds": seconds, "input_bytes": moved, "mbps": moved / seconds / 1e6,
            "hashes": {sid: markers.get(sid) for _, sid, _ in beam},
            "output_bytes": sum(committed_bytes(cluster, root, sid) for _, sid, _ in beam)}


def main() -> int:
    """Run the three configurations and print their lines and the RESULT line; exit 1 if not identical."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=4, help="document slice multiplier (tests/e2e/slices.py)")
    parser.add_argument("--memory-scales", default="", help="e.g. 4,16: rerun 2 TaskManagers at these scales")
    args = parser.parse_args()
    tmp = sc.bench_workdir("beam-cluster-")
    if tmp is None:
        return 1
    results: dict[str, dict] = {}
    with Cluster.start(tmp / "cluster") as cluster:
        moto_port = int(cluster.s3_endpoint.rsplit(":", 1)[1])
        proxy = FaultProxy(moto_port, host=cluster.service_host).start()  # counts what the workers write
        flink = FlinkCluster.start(cluster, tmp / "flink", taskmanagers=1,
                                   env={"TIDAL_S3_ENDPOINT_URL": proxy.endpoint})
        try:
            plain = sc.slice_recipe(tmp, "tiny_bench", scale=args.scale, sources=None)
            results["inprocess"] = measure(cluster, plain, tmp, "inprocess")
            # the whole slice on Flink (the tests run two of its sources), to compare with the in-process run
            text1 = bs.flink_recipe(tmp, flink, scale=args.scale, parallelism=1, sources=None)
            results["flink_1tm"] = measure(cluster, text1, tmp, "flink1")
            flink.add_taskmanager("flink-tm-2")
            flink.wait(2)
            text2 = bs.flink_recipe(tmp, flink, scale=args.scale, parallelism=2, sources=None)
            before = proxy.plan.put_bytes
            with WorkerMemory() as memory:
                results["flink_2tm"] = measure(cluster, text2, tmp, "flink2")
            staged_ratio = (proxy.plan.put_bytes - before) / results["flink_2tm"]["output_bytes"]
            extra = {}
            for scale in [int(s) for s in args.memory_scales.split(",") if s]:
                with WorkerMemory() as probe:
                    text = bs.flink_recipe(tmp, flink, scale=scale, parallelism=2, sources=None)
                    measure(cluster, text, tmp, f"mem{scale}")
                extra[f"peak_rss_worker_mb_{scale}x"] = round(probe.peak_kb / 1024, 1)
        finally:
            flink.stop()
            proxy.stop()
    for label, r in results.items():
        print(f"{label:10s} {r['seconds']:7.1f} s  {r['input_bytes'] / 1e6:7.2f} MB in  {r['mbps']:6.3f} MB/s")
    hashes = [r["hashes"] for r in results.values()]
    identical = all(h == hashes[0] and all(h.values()) for h in hashes)
    fields = {"runner": "FlinkRunner", "taskmanagers": 2, "identical": str(identical).lower(),
              "mbps_inprocess": round(results["inprocess"]["mbps"], 3),
              "mbps_flink_1tm": round(results["flink_1tm"]["mbps"], 3),
              "mbps_flink_2tm": round(results["flink_2tm"]["mbps"], 3),
              "scaling_2tm_vs_1tm": round(results["flink_2tm"]["mbps"] / results["flink_1tm"]["mbps"], 2),
              "peak_rss_worker_mb": round(memory.peak_kb / 1024, 1), "staged_bytes_ratio": round(staged_ratio, 2),
              **extra, "scale": args.scale}
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items()))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
