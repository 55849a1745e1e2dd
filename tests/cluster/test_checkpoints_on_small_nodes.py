"""A checkpoint larger than any node (issue 37, item 4): eight processes over ``jax.distributed``, each on a
node of the test cluster with a 1 GiB memory limit and 256 MiB disks, save a train state of over 2 GiB
straight to the bucket (each its own shards, tidal/train/shards.py), lose a node before the next save
(that checkpoint never counts), and restore the first one on eight fresh nodes into another mesh, bit for
bit. A node that held the whole state would be OOM-killed: one process saving the same state on a node of
the same size is, which shows the limit bites. The worker is tests/train/shards_worker.py.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from tests.cluster.harness import BUCKET, REPO, stop_node
from tests.ports import free_port
from tests.train.shards_worker import shapes

pytestmark = pytest.mark.timeout(1200)
PROCESSES, MEMORY_MB, TMPFS_MB = 8, 1024, 256
SCALE = 75776  # x 28 KiB: the state is just over twice a node's memory
STATE_BYTES = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d, _ in shapes(SCALE).values())


def run(cluster, tag: str, mode: str, location: str, step: int, processes: int, fsdp: int, tensor: int,
        workdir, env: dict[str, str] | None = None, timeout_s: float = 600) -> list[tuple]:
    """``processes`` workers on fresh nodes ``{tag}-<i>``: ``(exit code, log, RESULT, node usage)`` each."""
    nodes = [cluster.node(f"{tag}-{i}", memory_mb=MEMORY_MB, tmpfs_mb=TMPFS_MB) for i in range(processes)]
    coordinator = f"{nodes[0].address}:{free_port()}"
    procs, logs = [], []
    for i, node in enumerate(nodes):
        log = workdir / f"{node.name}.log"
        dist = ({"JAX_COORDINATOR_ADDRESS": coordinator, "JAX_NUM_PROCESSES": str(processes),
                 "JAX_PROCESS_ID": str(i)} if processes > 1 else {})
        argv = ["python", "-m", "tests.train.shards_worker", mode, location, str(step), str(fsdp), str(tensor),
                str(SCALE)]
        procs.append(node.start(argv, log=log, env={"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO),
                                                    "TIDAL_TRAIN_PEER_TIMEOUT_S": "20", **dist, **(env or {})}))
        logs.append(log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    for proc in procs:
        if proc.poll() is None:
            stop_node(proc, kill=True)
    out = []
    for proc, log in zip(procs, logs, strict=True):
        for _ in range(50):  # the cgroup watcher records the boot's usage once its processes are gone
            if proc.node_usage is not None:
                break
            time.sleep(0.1)
        text = log.read_text(errors="replace")
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        out.append((proc.returncode, text, json.loads(line[7:]) if line else None, proc.node_usage))
    return out


def describe(results) -> str:
    return "\n".join(f"--- rc={rc} usage={usage}\n{text[-1500:]}" for rc, text, _, usage in results)


def test_a_state_twice_a_nodes_memory_saves_and_restores_on_nodes_that_hold_only_their_shards(cluster, tmp_path):
    assert STATE_BYTES >= 2 * MEMORY_MB * 2**20 and STATE_BYTES >= 3 * TMPFS_MB * 2**20
    location = f"s3://{BUCKET}/small-nodes/.staging/train-big/"
    saved = run(cluster, "ck-save", "save", location, 100, PROCESSES, PROCESSES, 1, tmp_path)
    assert all(rc == 0 and result for rc, _, result, _ in saved), describe(saved)
    assert not any(usage.oom_killed for *_, usage in saved), describe(saved)
    assert sum(r["own_bytes"] for _, _, r, _ in saved) == STATE_BYTES  # every byte written once, by its owner
    assert "checkpoint 100 counts: in the bucket" in saved[0][1]

    lost = run(cluster, "ck-lose", "lose", location, 200, PROCESSES, PROCESSES, 1, tmp_path,
               env={"SHARDS_COMMIT_WAIT_S": "10", "TIDAL_TRAIN_PEER_TIMEOUT_S": "120"})  # our wait ends first
    assert lost[0][0] == 1 and "no record from processes [7]" in lost[0][1], describe(lost)

    restored = run(cluster, "ck-restore", "restore", location, 0, PROCESSES, PROCESSES // 2, 2, tmp_path)
    assert all(rc == 0 and result for rc, _, result, _ in restored), describe(restored)
    for _, text, result, usage in restored:
        assert result["step"] == 100 and result["wrong"] == [], text[-2000:]  # another mesh, bit for bit
        assert result["read_bytes"] < STATE_BYTES / 4 and not usage.oom_killed, (result, usage)
    assert "checkpoint 200 at" in restored[0][1] and "has arrays but no manifest" in restored[0][1]
    print("restore RSS after / peak (MiB):", [(round(r["rss_after_restore_bytes"] / 2**20),
                                                 round(r["peak_rss_bytes"] / 2**20)) for _, _, r, _ in restored])
    peaks = [usage.peak_bytes for *_, usage in saved + restored if usage.peak_bytes is not None]
    print(f"state {STATE_BYTES / 2**20:.0f} MiB on {PROCESSES} nodes of {MEMORY_MB} MiB; node peaks (MiB): "
          f"{[round(p / 2**20) for p in peaks]}")

    # the control: one process holding the whole state on a node of the same size is OOM-killed
    (rc, text, _, usage), = run(cluster, "ck-one", "save", f"s3://{BUCKET}/small-nodes/.staging/one/", 100, 1, 1, 1,
                                tmp_path, timeout_s=300)
    assert rc == 137 and usage.oom_killed, (rc, usage, text[-2000:])
