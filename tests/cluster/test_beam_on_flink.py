"""Beam data steps on a real Flink cluster whose TaskManagers share only the bucket.

A JobManager node and two TaskManager nodes, each with its SDK worker pool (tests/cluster/flink.py).
A slice of the tiny recipe (near-dedup on) runs its clean and tokenize steps through the Beam
provider's task group, prepare / launch / commit on three fresh nodes (tests/cluster/beam_scenario.py);
the committed outputs have the manifest root hashes of an in-process run on a local root, the jobs'
subtasks ran on both TaskManagers, and nothing is left in staging. Then, with a third TaskManager
node as spare capacity, a node running a subtask of a clean job is killed mid-job (SIGKILL of its
whole process tree): Flink restarts the failed region on the TaskManagers left, and the committed
output is byte-identical.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest

from tests.cluster import beam_scenario as bs
from tests.cluster import scenario as sc
from tests.cluster.flink import FlinkCluster
from tests.cluster.harness import NodeTimeout

pytestmark = pytest.mark.timeout(1800)


def _host_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("TIDAL_STORAGE", "TIDAL_S3", "MLFLOW_", "AWS_", "TIDAL_BEAM"))}


@pytest.fixture(scope="module")
def flink(cluster, tmp_path_factory):
    started = FlinkCluster.start(cluster, tmp_path_factory.mktemp("flink"), taskmanagers=2)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def flink_run(cluster, flink, local_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("beam-on-flink")
    text = bs.flink_recipe(tmp, flink)
    steps = bs.data_steps(text, tmp)
    root = f"s3://tidal/flink-{uuid.uuid4().hex[:8]}"
    jobs_before = {j["jid"] for j in flink.rest_get("/jobs/overview")["jobs"]}
    run = bs.run_on_flink(cluster, text, steps, root=root, run_key="flink-run", tmp=tmp)
    jobs = [j for j in flink.rest_get("/jobs/overview")["jobs"] if j["jid"] not in jobs_before]
    local_root, _ = sc.run_local(text, tmp, _host_env(), local_root)
    return {"text": text, "steps": steps, "run": run, "root": root, "local_root": local_root, "tmp": tmp, "jobs": jobs}


def test_clean_and_tokenize_on_flink_give_the_bytes_of_the_in_process_run(cluster, flink, flink_run):
    steps, run, root = flink_run["steps"], flink_run["run"], flink_run["root"]
    beam_steps = [s for s in steps if s[2] in bs.BEAM_KINDS]
    assert {k for _, _, k in beam_steps} == set(bs.BEAM_KINDS)
    differ = sc.differences(cluster, root, flink_run["local_root"], steps)
    assert not differ, f"the Flink run differs from the in-process run: {differ}"
    # one Flink job per Beam step, each finished, with subtasks on both TaskManager nodes
    assert len(flink_run["jobs"]) == len(beam_steps) and all(j["state"] == "FINISHED" for j in flink_run["jobs"])
    for job in flink_run["jobs"]:
        hosts = set()
        for vertex in flink.rest_get(f"/jobs/{job['jid']}")["vertices"]:
            detail = flink.rest_get(f"/jobs/{job['jid']}/vertices/{vertex['id']}")
            hosts |= {s.get("endpoint", s.get("host", "")).split(":")[0] for s in detail["subtasks"]}
        assert len(hosts) == 2, (job["name"], hosts)
    # only bucket URIs were handed over, and each committed step records that FlinkRunner ran it
    for name, xcom in run.xcoms.items():
        assert all(loc.startswith(root + "/") for loc in sc.xcom_locations(xcom)), (name, xcom)
        record = json.loads(sc._bucket_file(cluster, root, xcom["step_id"], "step.json"))
        assert record["provenance"]["runner"] == "FlinkRunner", (name, record["provenance"])
    staged = cluster.s3().list_objects_v2(Bucket="tidal", Prefix=root.removeprefix("s3://tidal/") + "/.staging/")
    assert staged.get("KeyCount", 0) == 0, [o["Key"] for o in staged.get("Contents", [])][:5]


def test_a_taskmanager_lost_mid_job_restarts_and_commits_the_same_bytes(cluster, flink, flink_run):
    steps, tmp = flink_run["steps"], flink_run["tmp"]
    clean = next(s for s in steps if s[2] == "clean")
    root = f"s3://tidal/flink-kill-{uuid.uuid4().hex[:8]}"
    upstream = [s for s in steps if s[2] == "fetch" and s[0].split("-", 1)[1] == clean[0].split("-", 1)[1]]
    bs.run_on_flink(cluster, flink_run["text"], upstream, root=root, run_key="flink-kill", tmp=tmp)
    flink.add_taskmanager("flink-tm-3")  # spare capacity, registered before the job starts
    flink.wait(3)
    killed: list[tuple[str, str]] = []  # (job id, TaskManager)
    errors: list[BaseException] = []

    def busy_taskmanager(jid: str) -> str | None:
        """A TaskManager running a subtask of job ``jid`` (the REST API names it by resource id)."""
        for vertex in flink.rest_get(f"/jobs/{jid}")["vertices"]:
            for sub in flink.rest_get(f"/jobs/{jid}/vertices/{vertex['id']}")["subtasks"]:
                if sub.get("status") == "RUNNING" and sub.get("taskmanager-id") in flink.taskmanagers:
                    return sub["taskmanager-id"]
        return None

    def kill_when_running() -> None:
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not killed:
                try:
                    running = [j for j in flink.rest_get("/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
                    ready = running and running[0]["tasks"].get("running", 0) + running[0]["tasks"].get(
                        "finished", 0) >= 2
                    victim = busy_taskmanager(running[0]["jid"]) if ready else None
                except OSError:  # the JobManager's REST answer took over 10 s (a loaded machine): ask again
                    time.sleep(0.5)
                    continue
                if victim is not None:
                    flink.kill_taskmanager(victim)  # the whole node: TaskManager, pool, SDK workers
                    killed.append((running[0]["jid"], victim))
                    return
                time.sleep(0.2)
        except BaseException as err:  # noqa: BLE001 - reported by the test below
            errors.append(err)

    killer = threading.Thread(target=kill_when_running, daemon=True)
    killer.start()
    try:
        out, _ = bs.run_task_group(cluster, flink_run["text"], clean[0], "clean", root=root, run_key="flink-kill",
                                   index=900, tmp=tmp, timeout=480)
    except NodeTimeout as err:  # what Flink made of the loss, for whoever reads the failure
        jobs = flink.rest_get("/jobs/overview")["jobs"]
        pytest.fail(f"the job did not finish after the TaskManager loss (killed: {killed}, killer: {errors}); "
                    f"jobs {jobs}\n"
                    f"{str(err)[-3000:]}\n{flink.log_tails(6000)}")
    killer.join(30)
    assert not errors, errors
    assert killed, "the TaskManager was never killed mid-job"
    job = flink.rest_get(f"/jobs/{killed[0][0]}")
    assert job["state"] == "FINISHED", job["state"]
    markers = sc.bucket_markers(cluster, root)
    assert markers[clean[1]] == sc.local_markers(flink_run["local_root"])[clean[1]], out[-3000:]
    staged = cluster.s3().list_objects_v2(Bucket="tidal", Prefix=root.removeprefix("s3://tidal/") + "/.staging/")
    assert staged.get("KeyCount", 0) == 0, [o["Key"] for o in staged.get("Contents", [])][:5]
    flink.wait(2)
