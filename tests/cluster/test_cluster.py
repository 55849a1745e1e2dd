"""The test cluster keeps its promise: nodes share the bucket, PostgreSQL (through MLflow) and the
MLflow server, and nothing else: not a hostname, ``localhost``, a scratch file, a cache, a process, SysV
IPC or the disk; and each node's limits bite: memory (OOM kill), CPU quota, tmpfs size."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from textwrap import dedent

import pytest

from tests.cluster.addresses import node_address
from tests.cluster.harness import BUCKET, REPO, STORAGE_CACHE, NodeError, NodeTimeout, stop_node
from tests.cluster.limits_scenario import dial_across_nodes, launcher_file_seen


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
    assert seen_a == ["node-a", b.address, "127.0.0.1"]
    assert seen_b == ["node-b", a.address, "127.0.0.1"]
    assert a.address != b.address and a.address.startswith(f"10.{cluster.network.octet}.")
    import socket

    assert socket.gethostname() not in ("node-a", "node-b")  # the host's UTS namespace is untouched


def test_node_addresses_stay_addresses_past_254_nodes():
    # a session may name more than 254 nodes: the fourth octet must not run past 254, nor reach the gateway
    assert [node_address(i, 70) for i in (1, 254, 255, 600)] == ["10.70.0.1", "10.70.0.254", "10.70.1.1",
                                                                  "10.70.2.92"]
    assert node_address(253 * 254, 70) == "10.70.252.254"
    for bad in ((0, 70), (253 * 254 + 1, 70), (1, 256)):
        with pytest.raises(ValueError):
            node_address(*bad)


def test_localhost_on_one_node_is_not_another_nodes_service(cluster, tmp_path):
    """A server on node B, bound to every address, answers node A at node B's name and address only:
    node A dialing ``localhost`` / ``127.0.0.1`` for it is refused, as between two pods."""
    seen, own = dial_across_nodes(cluster, tmp_path)
    address = cluster.node("net-b").address
    assert seen == ["localhost ConnectionRefusedError", "127.0.0.1 ConnectionRefusedError",
                    "net-b node-b here", f"{address} node-b here"]
    assert own == "127.0.0.1 node-b here"  # its own localhost is itself


def test_nodes_reach_nothing_but_the_cluster(cluster):
    """PostgreSQL and Redis listen on the host's 127.0.0.1: a node reaches them only through the gateway's
    relay, and the host's loopback is not routed to it at all."""
    code = """
        import socket, sys
        for host, port in (("127.0.0.1", 5432), (sys.argv[1], 5432)):
            try:
                socket.create_connection((host, port), timeout=5).close()
                print(host, "open")
            except OSError as err:
                print(host, type(err).__name__)
    """
    seen = cluster.node("node-a").run([sys.executable, "-c", dedent(code), cluster.service_host]).stdout
    assert seen.splitlines() == ["127.0.0.1 ConnectionRefusedError", f"{cluster.service_host} open"]


def test_nodes_run_the_image_not_the_launchers_working_tree(cluster):
    """The checkout's path on a node is the session's image: tracked code and the venv, read-only; a file
    the launcher writes into its working tree (ignored by git, or new since the image) is not there."""
    assert not launcher_file_seen(cluster)
    marker = f"launcher-only-{uuid.uuid4().hex[:8]}"
    new = REPO / "tests" / f"{marker}.txt"
    new.write_text("written after the image was built")
    code = f"""
        import os, sys
        from pathlib import Path
        import tidal
        repo = Path({str(REPO)!r})
        print(Path(tidal.__file__).is_relative_to(repo), (repo / "tests" / "tiers.py").is_file(),
              (repo / "tests" / "{marker}.txt").exists(), os.access(repo / "tidal", os.W_OK),
              os.environ["TIDAL_GIT_SHA"] == {cluster.image.git_sha!r})
    """
    try:
        seen = python(cluster.node("node-a"), code).split()
    finally:
        new.unlink()
    assert seen == ["True", "True", "False", "False", "True"]
    assert cluster.image.path != REPO and (cluster.image.path / ".venv" / "bin" / "python").exists()


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


# --- node limits (tests/cluster/limits.py) ---------------------------------------------------------
# Node names used by no other test: each test gets nodes of its own limits.


def need_cgroup(cluster, controller: str) -> None:
    """Skip where ``controller``'s limit is not enforced here (under CI=true the cluster refuses to start)."""
    if controller in cluster.limits_skipped:
        pytest.skip(f"{controller} limit not enforced on this machine: {cluster.limits_skipped[controller]}")


def cgroups_left(cluster, name: str) -> list[Path]:
    return [path for parent in cluster._cgroups.parents.values() for path in parent.glob(f"{name}-*")]


def test_a_node_over_its_memory_limit_is_oom_killed_and_reported(cluster):
    need_cgroup(cluster, "memory")
    node = cluster.node("limit-oom", memory_mb=256)
    allocate = """
        import sys
        chunks = []
        for i in range(int(sys.argv[1]) // 64):
            chunks.append(b"x" * (64 << 20))  # touched: charged to the node's memory cgroup
            print("allocated", (i + 1) * 64, "MiB", flush=True)
    """
    fits = node.run([sys.executable, "-c", dedent(allocate), "128"], timeout=60)
    assert "allocated 128 MiB" in fits.stdout and not fits.usage.oom_killed
    assert 128 < fits.usage.peak_mb < 256

    with pytest.raises(NodeError) as caught:
        node.run([sys.executable, "-c", dedent(allocate), "1024"], timeout=60)
    failed = caught.value
    assert failed.returncode == 137  # SIGKILL by the OOM killer, as kubelet reports OOMKilled
    assert "allocated 128 MiB" in failed.stdout and "allocated 1024 MiB" not in failed.stdout
    usage = failed.usage
    assert usage.oom_killed and usage.limits.memory_mb == 256
    assert 200 < usage.peak_mb <= 256
    assert f"OOM-killed at limit 256 MiB, peak {usage.peak_mb:.1f} MiB" in str(failed)
    assert cluster.usage[-1] == usage
    assert cgroups_left(cluster, "limit-oom") == []  # each boot's cgroup goes with it


def test_a_node_writing_past_its_tmpfs_limit_gets_enospc(cluster):
    write = """
        import errno, os, sys
        dirs = ["/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~/.cache")]
        print(*(os.statvfs(d).f_blocks * os.statvfs(d).f_frsize >> 20 for d in dirs))
        mib = int(sys.argv[1])
        try:
            with open("/tmp/big", "wb") as out:
                for _ in range(mib):
                    out.write(b"x" * (1 << 20))
            print("wrote", mib, "MiB")
        except OSError as err:
            print("failed", errno.errorcode[err.errno], err.strerror)
    """
    small = cluster.node("limit-disk", tmpfs_mb=64)
    over = small.run([sys.executable, "-c", dedent(write), "96"], timeout=60).stdout.splitlines()
    assert over == ["64 64 64 64", "failed ENOSPC No space left on device"]
    under = small.run([sys.executable, "-c", dedent(write), "32"], timeout=60).stdout.splitlines()
    assert under == ["64 64 64 64", "wrote 32 MiB"]
    roomy = cluster.node("limit-disk-roomy", tmpfs_mb=256)
    assert roomy.run([sys.executable, "-c", dedent(write), "96"], timeout=60).stdout.splitlines() == [
        "256 256 256 256", "wrote 96 MiB"]


def test_a_nodes_cpu_quota_holds_it_to_half_a_core(cluster):
    need_cgroup(cluster, "cpu")
    need_cgroup(cluster, "memory")
    code = """
        import resource, time
        from pathlib import Path
        own = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                own[controller] = Path("/sys/fs/cgroup", controller, path.lstrip("/"))
        read = lambda controller, file: (own[controller] / file).read_text().strip()
        print(read("cpu", "cpu.cfs_quota_us"), read("cpu", "cpu.cfs_period_us"),
              int(read("memory", "memory.limit_in_bytes")) >> 20)
        def used():
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return usage.ru_utime + usage.ru_stime
        start, cpu0 = time.monotonic(), used()
        while time.monotonic() - start < 2:
            pass
        print(round((used() - cpu0) / (time.monotonic() - start), 3))
    """
    result = cluster.node("limit-cpu", cpus=0.5).run([sys.executable, "-c", dedent(code)], timeout=60)
    quota, cores = result.stdout.splitlines()
    assert quota == "50000 100000 8192"  # half a core; the memory limit is the default, as for every node
    assert 0 < float(cores) < 0.8, f"a busy loop got {cores} cores under a 0.5-core quota"
    assert result.usage.limits.cpus == 0.5


def test_sysv_ipc_is_private_to_a_node(cluster, tmp_path):
    log = tmp_path / "ipc-a.log"
    proc = cluster.node("ipc-a").start(["bash", "-c", "ipcmk -M 4096 && ipcs -m && echo ready && exec sleep 60"],
                                       log=log)
    try:
        deadline = time.monotonic() + 30
        while "ready" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        on_a = log.read_text()
        assert "ready" in on_a, on_a
        keys_a = [line.split()[0] for line in on_a.splitlines() if line.startswith("0x")]
        assert len(keys_a) == 1, on_a  # only its own segment: not the host's (PostgreSQL's) nor another node's
        on_b = cluster.node("ipc-b").run(["ipcs", "-m"]).stdout
        assert [line for line in on_b.splitlines() if line.startswith("0x")] == [], on_b
        on_host = subprocess.run(["ipcs", "-m"], check=True, capture_output=True, text=True).stdout
        assert keys_a[0] not in on_host
    finally:
        stop_node(proc)
    deadline = time.monotonic() + 30
    while proc.node_usage is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if "memory" not in cluster.limits_skipped:
        assert proc.node_usage is not None and proc.node_usage.node == "ipc-a" and not proc.node_usage.oom_killed
        assert cgroups_left(cluster, "ipc-a") == []
