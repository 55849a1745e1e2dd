"""A two-host training run over ``jax.distributed`` on the test cluster, for
tests/cluster/test_multihost_node_loss.py: process 0 and process 1 each on a node of its own, the
coordinator at node 0's address, the step's staging location in the bucket as the only thing the
two nodes (and their successors) share.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.harness import BUCKET, Cluster, stop_node
from tests.cluster.train_scenario import COUNTED, GRACE_S, PREEMPTED, RESUMED, STEP_LINE
from tests.storage.servers import free_port

PROCESSES = 2


@dataclass
class HostAttempt:
    """One start of both processes, each on a fresh node."""

    nodes: list[str]
    lost: int | None  # the process whose node was killed (or sent SIGTERM), or None (ran to the end)
    target: int | None  # lost at or after this step, once one of the attempt's checkpoints counted
    how: str = "SIGKILL"  # SIGKILL: its whole node; SIGTERM: that process's node only, SIGKILL after the grace
    returncodes: list[int | None] = field(default_factory=list)
    resumed_from: list[int | None] = field(default_factory=list)  # per process
    preempted_at: list[int | None] = field(default_factory=list)  # per process: the step it checkpointed (SIGTERM)
    counted: list[int] = field(default_factory=list)  # checkpoints process 0 got into the bucket
    last_step: int = 0  # the last step process 0 printed
    survivor_exit_s: float | None = None  # seconds from the kill (or SIGTERM) to the other process's exit
    all_exit_s: float | None = None  # seconds from the kill (or SIGTERM) until every process exited
    logs: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return "\n".join(f"--- {node} ({self.how} {self.lost} at {self.target}) rc={rc}\n{log[-2500:]}"
                         for node, rc, log in zip(self.nodes, self.returncodes, self.logs, strict=True))


def run_hosts(cluster: Cluster, tag: str, step_uri: str, root: str, workdir: Path, *, lose: int | None = None,
              target: int | None = None, how: str = "SIGKILL", watchdog_s: int = 60, peer_timeout_s: int = 20,
              timeout_s: float = 900) -> HostAttempt:
    """Start ``python -m tidal.train STEP_URI`` as processes 0 and 1 on nodes ``{tag}-0`` and ``{tag}-1``;
    with ``lose``, at or after ``target`` SIGKILL that process's node once a checkpoint of this attempt
    counts (``how="SIGKILL"``) and wait for the other to exit, or send SIGTERM to every process of that
    node only (``how="SIGTERM"``, as GKE preempts one VM of a slice) and wait for both, SIGKILLing what is
    left after :data:`GRACE_S`; else wait for both."""
    nodes = [cluster.node(f"{tag}-{i}") for i in range(PROCESSES)]
    coordinator = f"{nodes[0].address}:{free_port()}"
    attempt = HostAttempt([n.name for n in nodes], lose, target, how)
    logs = [workdir / f"{n.name}.log" for n in nodes]
    procs = []
    for i, (node, log) in enumerate(zip(nodes, logs, strict=True)):
        log.write_bytes(b"")
        env = {"TIDAL_STORAGE_ROOT": root, "JAX_COORDINATOR_ADDRESS": coordinator,
               "JAX_NUM_PROCESSES": str(PROCESSES), "JAX_PROCESS_ID": str(i), "TIDAL_TRAIN_WATCHDOG_S": str(watchdog_s),
               "TIDAL_TRAIN_PEER_TIMEOUT_S": str(peer_timeout_s)}
        procs.append(node.start(["python", "-m", "tidal.train", step_uri], log=log, env=env))
    deadline = time.monotonic() + timeout_s
    try:
        killed = None
        while time.monotonic() < deadline:
            if lose is not None and killed is None:
                text = logs[0].read_text(errors="replace")
                steps = STEP_LINE.findall(text)
                # a SIGKILL once a checkpoint of this attempt counted (what it may lose is then bounded); a
                # SIGTERM loses nothing, so at once: while the processes are surely still in their step loop
                if steps and int(steps[-1][0]) >= target and (how == "SIGTERM" or COUNTED.search(text)):
                    if how == "SIGKILL":
                        stop_node(procs[lose], kill=True)
                    else:
                        with contextlib.suppress(ProcessLookupError):  # it may have ended on its own
                            os.killpg(procs[lose].pid, signal.SIGTERM)
                    killed = time.monotonic()
            if killed is not None and procs[1 - lose].poll() is not None and attempt.survivor_exit_s is None:
                attempt.survivor_exit_s = time.monotonic() - killed
            if killed is not None and all(p.poll() is not None for p in procs):
                attempt.all_exit_s = time.monotonic() - killed
                break
            if killed is not None and how == "SIGKILL" and attempt.survivor_exit_s is not None:
                break
            if killed is not None and how == "SIGTERM" and time.monotonic() - killed > GRACE_S:
                break  # the grace is over: the finally below SIGKILLs what is left, as the kubelet does
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                stop_node(proc, kill=True)
    for proc, log in zip(procs, logs, strict=True):
        attempt.returncodes.append(proc.returncode)
        text = log.read_text(errors="replace")
        attempt.logs.append(text)
        match = RESUMED.search(text)
        attempt.resumed_from.append(int(match.group(1)) if match else None)
        match = PREEMPTED.search(text)
        attempt.preempted_at.append(int(match.group(1)) if match else None)
    steps = STEP_LINE.findall(attempt.logs[0])
    attempt.last_step = int(steps[-1][0]) if steps else 0
    attempt.counted = [int(m) for m in COUNTED.findall(attempt.logs[0])]
    return attempt


def copy_spec(cluster: Cluster, step_uri: str, to_uri: str) -> None:
    """A second staging location for the same step (its ``spec.json``): an independent run of it."""
    s3 = cluster.s3()
    body = s3.get_object(Bucket=BUCKET, Key=_key(step_uri, "spec.json"))["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=_key(to_uri, "spec.json"), Body=body)


def staged_result(cluster: Cluster, step_uri: str) -> dict:
    """The deterministic part of a finished run staged at ``step_uri``: parameter hash, final loss, the
    whole ``(step, loss, grad_norm)`` curve."""
    s3 = cluster.s3()

    def read(name: str) -> bytes:
        return s3.get_object(Bucket=BUCKET, Key=_key(step_uri, name))["Body"].read()

    summary = json.loads(read("summary.json"))
    curve = [(r["step"], r["loss"], r.get("grad_norm")) for r in map(json.loads, read("metrics.jsonl").splitlines())
             if "loss" in r]  # the step-0 line holds the initial evaluation only
    return {"params_sha256": summary["params_sha256"], "final_train_loss": summary["final_train_loss"],
            "mesh": summary["mesh"], "curve": curve}


def _key(uri: str, name: str) -> str:
    return f"{uri.removeprefix(f's3://{BUCKET}/').rstrip('/')}/{name}"


__all__ = ["HostAttempt", "copy_spec", "run_hosts", "staged_result"]
