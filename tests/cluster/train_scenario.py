"""Training that loses its node, shared by tests/cluster/test_node_loss.py and bench/node_loss.py.

The train step of a slice of the tiny recipe runs on the test cluster with an ``s3://`` root:
its upstream steps on one node, its prepare on another, then attempts of the trainer, each on a
fresh node (empty disk), each but the last lost at a chosen step (SIGKILL of the whole node, or
SIGTERM with a 30 s grace, as GKE gives a spot VM), then the commit on a last node. Every attempt
after the first must resume from the newest checkpoint in the bucket.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import scenario as sc
from tests.cluster.harness import Cluster, stop_node
from tests.storage.servers import FaultPlan, FaultProxy

STEP_LINE = re.compile(r"^step (\d+)/(\d+) ", re.MULTILINE)
RESUMED = re.compile(r"resumed from checkpoint step (\d+)")
PREEMPTED = re.compile(r"preempted: checkpoint of step (\d+) saved")
COUNTED = re.compile(r"checkpoint (\d+) counts: in the bucket")
GRACE_S = 30  # terminationGracePeriodSeconds of a GKE pod (the default)


def train_recipe(tmp: Path, steps: int = 200, checkpoint_every: int = 10, name: str = "tiny_nl",
                 **changes: object) -> str:
    """The slice with a longer training of small steps, a metrics line (and a progress line) per step;
    ``changes``: more dotted recipe fields."""
    return sc.slice_recipe(tmp, name=name, **{"train.steps": steps, "train.checkpoint_every": checkpoint_every,
                                              "train.log_every": 1, "train.eval_every": steps,
                                              "train.keep_checkpoints": 1, **changes})


@dataclass
class Attempt:
    """One trainer process on its own node."""

    node: str
    lost: str | None  # "SIGKILL", "SIGTERM" or None (ran to the end)
    target: int | None  # the step at or after which it was lost
    last_step: int = 0  # the last step it printed
    resumed_from: int | None = None  # the checkpoint step it started from
    preempted_at: int | None = None  # SIGTERM: the step it checkpointed before exiting 75
    counted: list[int] = field(default_factory=list)  # checkpoints it got into the bucket, in order
    returncode: int | None = None
    seconds: float = 0.0
    log: str = ""
    injected: int = 0  # 500/503 answers the fault proxy gave this attempt's trainer instead of the bucket's


def resumable(counted: list[int], fallback: int, last_step: int, every: int) -> set[int]:
    """The checkpoints a trainer lost by SIGKILL may rightly be resumed from: the newest one its log says
    counted (``counted``, else ``fallback``: the one it resumed from), or the next multiple of ``every`` up to
    its last printed step, when the kill fell between that checkpoint's manifest reaching the bucket and the
    log line that says so (the line is printed after the upload)."""
    newest = (counted or [fallback])[-1]
    following = (newest // every + 1) * every
    return {newest} | ({following} if following <= last_step else set())


@dataclass
class NodeLossRun:
    root: str
    step_name: str
    step_id: str
    prepared: dict
    attempts: list[Attempt] = field(default_factory=list)
    commit_output: str = ""


def upstream(cluster: Cluster, recipe_text: str, steps: list[tuple[str, str, str]], *, root: str,
             run_key: str) -> None:
    """Every step before training, in plan order, in one node (``tidal run --step`` each); steps already
    committed under ``root`` (their ``_SUCCESS`` in the bucket) are left out, as prepare would skip them."""
    committed = sc.bucket_markers(cluster, root)
    names = [name for name, step_id, kind in steps if kind != "train" and step_id not in committed]
    if not names:
        return
    script = f'for s in "$@"; do python -m tidal.cli run recipe.yaml --step "$s" --run-key {run_key} || exit 1; done'
    sc.on_node_argv(cluster, "upstream", recipe_text, ["bash", "-c", script, "steps", *names], root=root,
                    timeout=1200)


def _attempt(cluster: Cluster, index: int, step_uri: str, root: str, workdir: Path, lost: str | None,
             target: int | None, timeout_s: float, disk_mb: int | None = None, faults_every: int = 0) -> Attempt:
    attempt = Attempt(f"train-{index}", lost, target)
    log = workdir / f"{attempt.node}.log"
    log.write_bytes(b"")
    tick = time.perf_counter()
    env = {"TIDAL_STORAGE_ROOT": root}
    proxy = None
    if faults_every:  # every faults_every-th call to the bucket answered 500 or 503 (FaultPlan)
        proxy = FaultProxy(int(cluster.s3_endpoint.rsplit(":", 1)[1]), FaultPlan(every=faults_every),
                           host=cluster.service_host).start()
        env["TIDAL_S3_ENDPOINT_URL"] = proxy.endpoint
    try:
        return _run_attempt(cluster, attempt, step_uri, log, env, tick, lost, target, timeout_s, disk_mb)
    finally:
        if proxy is not None:
            proxy.stop()
            attempt.injected = sum(proxy.plan.injected.values())


def _run_attempt(cluster: Cluster, attempt: Attempt, step_uri: str, log: Path, env: dict[str, str], tick: float,
                 lost: str | None, target: int | None, timeout_s: float, disk_mb: int | None) -> Attempt:
    proc = cluster.node(attempt.node, disk_mb=disk_mb).start(["python", "-m", "tidal.train", step_uri], log=log,
                                                             env=env)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            steps = STEP_LINE.findall(text)
            # lost at or after ``target`` once a checkpoint of this attempt counts (under load the first
            # upload can take longer than the steps up to target; losing the node before it is a
            # restart from where the previous attempt left, which the test does not try to prove)
            if lost and steps and int(steps[-1][0]) >= target and COUNTED.search(text):
                if lost == "SIGKILL":
                    stop_node(proc, kill=True)
                else:  # SIGTERM to every process of the node, SIGKILL after the grace
                    import os

                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=GRACE_S)
                    except subprocess.TimeoutExpired:
                        stop_node(proc, kill=True)
                break
            time.sleep(0.01)
        if proc.poll() is None and not lost:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            stop_node(proc, kill=True)
    attempt.returncode, attempt.seconds = proc.returncode, time.perf_counter() - tick
    attempt.log = log.read_text(errors="replace")
    steps = STEP_LINE.findall(attempt.log)
    attempt.last_step = int(steps[-1][0]) if steps else 0
    if match := RESUMED.search(attempt.log):
        attempt.resumed_from = int(match.group(1))
    attempt.counted = [int(m) for m in COUNTED.findall(attempt.log)]
    if match := PREEMPTED.search(attempt.log):
        attempt.preempted_at = int(match.group(1))
    return attempt


def run_with_losses(cluster: Cluster, recipe_text: str, steps: list[tuple[str, str, str]], *, root: str,
                    run_key: str, losses: list[tuple[str, int]], workdir: Path,
                    timeout_s: float = 600, disk_mb: int | None = None, faults_every: int = 0) -> NodeLossRun:
    """Upstream, prepare, one trainer attempt per entry of ``losses`` (``(signal, step)``: lost there)
    then one that runs to the end, each on a fresh node (with disks of ``disk_mb`` MiB, when given), then
    the commit on another. With ``faults_every`` N > 0 each trainer reaches the bucket
    through a proxy that answers every N-th request with 500 or 503 (N = 100: 1 %)."""
    name, step_id, _ = next(s for s in steps if s[2] == "train")
    upstream(cluster, recipe_text, steps, root=root, run_key=run_key)
    proc = sc.on_node_argv(cluster, "train-prep", recipe_text, ["python", "-c", sc.PREPARE, name], root=root)
    prepared = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("XCOM")).removeprefix("XCOM"))
    run = NodeLossRun(root, name, step_id, prepared)
    for index, (lost, target) in enumerate([*losses, (None, None)]):
        run.attempts.append(_attempt(cluster, index, prepared["step_uri"], root, workdir, lost, target, timeout_s,
                                     disk_mb, faults_every))
    proc = sc.on_node_argv(cluster, "train-commit", recipe_text,
                           ["python", "-c", sc.COMMIT, name, json.dumps(prepared), run_key], root=root)
    run.commit_output = proc.stdout + proc.stderr
    return run


__all__ = ["Attempt", "NodeLossRun", "run_with_losses", "train_recipe", "upstream"]
