"""Share nothing but the bucket (docs/architecture.md §0), proven on the test cluster.

A slice of the tiny recipe runs with an ``s3://`` root, every step on fresh nodes (the first step of
each Beam kind and training as prepare / launch / commit on three nodes, handing over only the
prepare's XCom; bench/share_nothing.py splits every one); then
``tidal report``, ``failures``, ``verify`` and ``lineage`` run on another node and see everything;
a gate failed on purpose on one node is visible, with its evidence, from another; every committed
output has the manifest root hash of a local-root run in one process.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from tests.cluster import scenario as sc

pytestmark = pytest.mark.timeout(1800)


def _host_env() -> dict[str, str]:
    """This process's environment without any storage or tracking setting (the local reference run)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("TIDAL_STORAGE", "TIDAL_S3", "MLFLOW_", "AWS_"))}


@pytest.fixture(scope="module")
def shared_run(cluster, local_root, tmp_path_factory):
    """The slice run once on the cluster and once locally (module scope: the tests below read it)."""
    tmp = tmp_path_factory.mktemp("share-nothing")
    text = sc.slice_recipe(tmp)
    steps = sc.step_names(text, tmp)
    root = f"s3://tidal/sn-{uuid.uuid4().hex[:8]}"
    # one step of each kind split over three nodes (bench/share_nothing.py splits every one)
    # ... and every 100th call to the bucket answered with a 500 or 503 (1 %): retried, never a failure
    run = sc.run_on_nodes(cluster, text, steps, root=root, run_key="sn-run", split_each=False, faults_every=100)
    local_root, _ = sc.run_local(text, tmp, _host_env(), local_root)
    return {"text": text, "steps": steps, "run": run, "root": root, "local_root": local_root, "tmp": tmp}


def test_every_step_on_its_own_node_gives_the_bytes_of_a_local_run(cluster, shared_run):
    steps, run = shared_run["steps"], shared_run["run"]
    assert sum(run.injected.values()) >= 4 and set(run.injected) == {500, 503}, run.injected  # the faults happened
    remote = sc.bucket_markers(cluster, shared_run["root"])
    assert sorted(remote) == sorted(step_id for _, step_id, _ in steps)
    differ = sc.differences(cluster, shared_run["root"], shared_run["local_root"], steps)
    assert not differ, f"the cluster run differs from the local run: {differ}"
    # every hand-over between the split tasks is a bucket URI, never a path on the writer's disk
    assert {kind for name, _, kind in steps if name in run.xcoms} == set(sc.SPLIT_KINDS), run.xcoms.keys()
    for name, xcom in run.xcoms.items():
        locations = sc.xcom_locations(xcom)
        assert locations and all(loc.startswith(shared_run["root"] + "/") for loc in locations), (name, xcom)
    # nothing is left in staging after the commits
    staged = cluster.s3().list_objects_v2(Bucket="tidal", Prefix=shared_run["root"].removeprefix("s3://tidal/")
                                          + "/.staging/")
    assert staged.get("KeyCount", 0) == 0, [o["Key"] for o in staged.get("Contents", [])][:5]


def test_another_node_sees_everything(cluster, shared_run):
    text, root = shared_run["text"], shared_run["root"]
    report = sc.on_node(cluster, "observer-report", text, ["report", "recipe.yaml", "--run-key", "sn-run"],
                        root=root)
    for name, _, _ in shared_run["steps"]:
        assert name in report.stdout, (name, report.stdout[-2000:])
    verify = sc.on_node(cluster, "observer-verify", text, ["verify", "recipe.yaml", "--json"], root=root)
    checked = json.loads(verify.stdout)["steps"]
    assert len(checked) >= len(shared_run["steps"]) and all(s["ok"] for s in checked), verify.stdout[-2000:]
    assert all(s["location"].startswith(root) for s in checked)
    lineage = sc.on_node(cluster, "observer-lineage", text, ["lineage", "recipe.yaml", "--json"], root=root)
    chain = json.loads(lineage.stdout)
    assert chain, lineage.stdout[-2000:]


def test_a_failure_on_one_node_is_visible_from_another(cluster, shared_run):
    tmp, root = shared_run["tmp"], shared_run["root"]
    failing = sc.slice_recipe(tmp, "tiny_sn", **{"gate.min_total_tokens": 10**12})
    proc = sc.on_node(cluster, "fail-node", failing, ["run", "recipe.yaml", "--step", "gate", "--run-key", "sn-fail"],
                      root=root, check=False)
    assert proc.returncode != 0
    report = sc.on_node(cluster, "observer-failed", failing, ["report", "recipe.yaml", "--run-key", "sn-fail"],
                        root=root)
    assert "FAILED" in report.stdout and "expected >= 1e+12" in report.stdout, report.stdout[-3000:]
    docs = next(line.split()[-1] for line in report.stdout.splitlines() if "data docs:" in line)
    assert docs.startswith(root + "/.failed/gate-")  # the evidence is an object in the bucket ...
    key = docs.removeprefix("s3://tidal/")
    assert b"<html" in cluster.s3().get_object(Bucket="tidal", Key=key)["Body"].read()[:2000].lower()  # ... readable
    failures = sc.on_node(cluster, "observer-failures", failing, ["failures", "recipe.yaml", "--json"], root=root)
    records = json.loads(failures.stdout)
    assert any(r.get("step") == "gate" or "gate" in str(r.get("task_id", "")) for r in records), failures.stdout[:2000]
