"""The test cluster keeps its promise: nodes share the bucket, PostgreSQL (through MLflow) and the
MLflow server, and nothing else: not a hostname, a scratch file, a cache, a process or the disk."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from textwrap import dedent

import pytest

from tests.cluster.harness import BUCKET, REPO, STORAGE_CACHE, NodeError, NodeTimeout, node_address


def python(node, code: str, **kwargs) -> str:
    """Run ``code`` with the repository's Python on ``node``; its stdout, stripped."""
    return node.run([sys.executable, "-c", dedent(code)], **kwargs).stdout.strip()


def host_processes(pattern: str) -> list[str]:
    """Host processes whose command line matches ``pattern`` (``pgrep -f``), as 'pid cmdline'."""
    found = subprocess.run(["pgrep", "-af", pattern], check=False, capture_output=True, text=True)
    return found.stdout.splitlines()


def test_nodes_have_their_own_hostnames_and_resolve_each_other(cluster):
    a, b = cluster.node("node-a"), cluster.node("node-b")
    code = """
        import socket, sys
        print(socket.gethostname(), socket.gethostbyname(sys.argv[1]), socket.gethostbyname("localhost"))
    """
    seen_a = a.run([sys.executable, "-c", dedent(code), "node-b"]).stdout.split()
    seen_b = b.run([sys.executable, "-c", dedent(code), "node-a"]).stdout.split()
    assert seen_a == ["node-a", "127.0.0.1", "127.0.0.1"]
    assert seen_b == ["node-b", "127.0.0.1", "127.0.0.1"]
    import socket

    assert socket.gethostname() not in ("node-a", "node-b")  # the host's UTS namespace is untouched


def test_node_addresses_stay_addresses_past_254_nodes(cluster):
    # a session may name more than 254 nodes: the fourth octet must not run past 254
    assert [node_address(i) for i in (1, 254, 255, 600)] == ["127.0.2.1", "127.0.2.254", "127.0.3.1", "127.0.4.92"]
    with pytest.raises(ValueError):
        node_address(0)
    code = """
        import socket, sys
        server = socket.create_server((sys.argv[1], 0))
        client = socket.create_connection(server.getsockname(), timeout=5)
        print(server.getsockname()[0])
    """
    out = cluster.node("node-a").run([sys.executable, "-c", dedent(code), node_address(600)]).stdout.strip()
    assert out == "127.0.4.92"


def test_scratch_and_caches_do_not_outlive_a_node(cluster):
    marker = f"left-{uuid.uuid4().hex[:8]}"
    places = ["/tmp", "/var/tmp", "/dev/shm", "~/.cache", "~/.config", STORAGE_CACHE, "."]
    code = f"""
        import os, sys
        from pathlib import Path
        places = [Path(p).expanduser() / {marker!r} for p in {places!r}]
        if sys.argv[1] == "write":
            for path in places:
                path.write_text("a node's local disk is not a channel")
            assert os.environ["TIDAL_STORAGE_CACHE"] == {STORAGE_CACHE!r}
            print(os.getcwd())
        else:
            print(" ".join(str(p) for p in places if p.exists()) or "none")
    """
    cwd = cluster.node("node-a").run([sys.executable, "-c", dedent(code), "write"]).stdout.strip()
    assert cwd.startswith("/tmp/")  # the command's working directory is on the node's own /tmp
    assert cluster.node("node-b").run([sys.executable, "-c", dedent(code), "read"]).stdout.strip() == "none"
    assert cluster.node("node-a").run([sys.executable, "-c", dedent(code), "read"]).stdout.strip() == "none"
    on_host = [p for p in (Path(d).expanduser() / marker for d in [*places[:-1], cwd]) if p.exists()]
    assert on_host == []


def test_a_nodes_processes_die_with_it(cluster):
    marker = f"tidal-node-sleeper-{uuid.uuid4().hex[:8]}"
    node = cluster.node("node-a")
    done = {}
    runner = threading.Thread(target=lambda: done.setdefault("out", node.run(
        ["bash", "-c", f"(exec -a {marker} sleep 1000) & sleep 4; echo pid-in-node $!"])))
    runner.start()
    deadline = time.monotonic() + 30
    while not host_processes(f"^{marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    seen_running = host_processes(f"^{marker}")
    runner.join(timeout=60)
    assert seen_running, "the background process was never visible from the host: the check proves nothing"
    assert "pid-in-node" in done["out"].stdout
    assert host_processes(f"^{marker}") == []


def test_a_timeout_kills_the_node_and_reports_its_output(cluster):
    marker = f"tidal-node-hang-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    with pytest.raises(NodeTimeout) as caught:
        cluster.node("node-a").run(["bash", "-c", f"echo booted; (exec -a {marker} sleep 1000) & sleep 1000"],
                                   timeout=3)
    assert time.monotonic() - started < 30
    assert "booted" in str(caught.value)
    assert host_processes(f"^{marker}") == []
    with pytest.raises(NodeError) as failed:
        cluster.node("node-a").run(["bash", "-c", "echo why >&2; exit 3"])
    assert failed.value.returncode == 3 and "why" in str(failed.value)


def test_the_disk_is_read_only_but_the_archives_are_there(cluster):
    code = f"""
        import os
        from pathlib import Path
        for path in [Path({str(REPO)!r}) / "node-was-here", Path.home() / "node-was-here"]:
            try:
                path.write_text("x")
                print("writable", path)
            except OSError as err:
                print("refused", err.strerror)
        archives = Path(os.environ["TIDAL_ARCHIVE_CACHE"])
        print(sorted(p.name for p in archives.iterdir()) if archives.is_dir() else [])
        print(os.access(archives, os.W_OK))
    """
    lines = python(cluster.node("node-a"), code).splitlines()
    assert lines[:2] == ["refused Read-only file system"] * 2
    host_archives = Path(cluster.env["TIDAL_ARCHIVE_CACHE"])
    expected = sorted(p.name for p in host_archives.iterdir()) if host_archives.is_dir() else []
    assert lines[2] == str(expected) and lines[3] == "False"


def test_nodes_share_the_bucket(cluster):
    key = f"root/handoff-{uuid.uuid4().hex[:8]}.txt"
    client = "import os, boto3; s3 = boto3.client('s3', endpoint_url=os.environ['TIDAL_S3_ENDPOINT_URL'])\n"
    python(cluster.node("node-a"), client + f"s3.put_object(Bucket={BUCKET!r}, Key={key!r}, Body=b'from node-a')")
    got = python(cluster.node("node-b"),
                 client + f"print(s3.get_object(Bucket={BUCKET!r}, Key={key!r})['Body'].read().decode())")
    assert got == "from node-a"
    assert cluster.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"from node-a"


def test_nodes_share_mlflow_and_its_artifacts_land_in_the_bucket(cluster):
    experiment = f"cluster-{uuid.uuid4().hex[:8]}"
    run_id = python(cluster.node("node-a"), f"""
        from pathlib import Path
        import mlflow
        mlflow.set_experiment({experiment!r})
        Path("report.txt").write_text("logged on node-a")
        with mlflow.start_run() as run:
            mlflow.log_metric("loss", 2.5, step=7)
            mlflow.log_artifact("report.txt")
        print(run.info.run_id)
    """).splitlines()[-1]
    seen = python(cluster.node("node-b"), f"""
        from pathlib import Path
        from mlflow.tracking import MlflowClient
        client = MlflowClient()
        run = client.get_run({run_id!r})
        history = client.get_metric_history({run_id!r}, "loss")
        local = client.download_artifacts({run_id!r}, "report.txt", "/tmp")
        print(client.get_experiment(run.info.experiment_id).name, run.data.metrics["loss"], history[0].step)
        print(run.info.artifact_uri)
        print(Path(local).read_text())
    """).splitlines()
    assert seen[0].split() == [experiment, "2.5", "7"]
    assert seen[1].startswith("mlflow-artifacts:")  # proxied: nodes never see the bucket path
    assert seen[2] == "logged on node-a"
    listed = cluster.s3().list_objects_v2(Bucket=BUCKET, Prefix="mlflow-artifacts/")
    keys = [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(f"/{run_id}/artifacts/report.txt")]
    assert len(keys) == 1, [o["Key"] for o in listed.get("Contents", [])]
    assert cluster.s3().get_object(Bucket=BUCKET, Key=keys[0])["Body"].read() == b"logged on node-a"
