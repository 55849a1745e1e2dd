"""The share-nothing scenario, shared by tests/cluster/test_share_nothing.py and bench/share_nothing.py.

A slice of the tiny recipe runs with an ``s3://`` root, every step in a fresh node of the test
cluster (:mod:`tests.cluster.harness`: private /tmp, caches and storage cache; the bucket, the
MLflow server and PostgreSQL are all they share). The recipe reaches each node on stdin, as an
image carries its DAG bundle: no file of the test process is visible in a node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.cluster.harness import BUCKET, Cluster
from tests.e2e.slices import write_slice_recipe
from tests.storage.servers import FaultPlan, FaultProxy

REPO = Path(__file__).resolve().parents[2]
NODE_SCRIPT = 'cat > recipe.yaml && exec "$@"'
SPLIT_KINDS = ("clean", "tokenize", "train")  # run as prepare / launch / commit on three nodes, as in Airflow
PREPARE = """
import json, sys
from tidal.core.load import load_pipeline
from tidal.core import beam_job, remote
pipe = load_pipeline("recipe.yaml")
name = sys.argv[1]
prepared = (remote if pipe.graph[name].kind == "train" else beam_job).prepare(pipe, name)
print("XCOM" + json.dumps(prepared))
"""
COMMIT = """
import json, sys
from tidal.core.load import load_pipeline
from tidal.core import beam_job, remote
pipe = load_pipeline("recipe.yaml")
name, prepared, run_key = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
if pipe.graph[name].kind == "train":
    result = remote.commit(pipe, name, started_at=prepared["started_at"], launcher="gke", workload=name,
                           run_key=run_key)
else:
    result = beam_job.commit(pipe, name, prepared=prepared, runner=pipe.recipe.beam.runner, workload=name,
                             run_key=run_key)
print("COMMITTED", result.status, result.step_id)
"""


# The cluster scenarios' sources: English prose and the dictionary (near duplicates: every data step kind
# does real work). Each source is three steps (fetch, clean, tokenize), each a node, an Airflow task or a
# Flink job, and the scenarios test where steps run, not the corpora: Chinese poetry and UDHR are the e2e
# test's (tests/e2e) and the data tests'.
CLUSTER_SOURCES = ("brown", "gcide")


def keep_sources(data: dict, sources: tuple[str, ...]) -> dict:
    """``data`` (a recipe as a dict) with only ``sources``: their mixture weights and evaluation sources kept,
    the held-out-only sources dropped from the evaluation (none left: no evaluation sources)."""
    data["sources"] = {k: v for k, v in data["sources"].items() if k in sources}
    weights = data.get("mixture", {}).get("weights")
    if weights:
        data["mixture"]["weights"] = {k: v for k, v in weights.items() if k in sources}
    evaluation = data.get("evaluation") or {}
    if "sources" in evaluation:
        evaluation["sources"] = [k for k in evaluation["sources"] if k in sources]
        if not evaluation["sources"]:
            evaluation.pop("sources")
    return data


def slice_recipe(tmp: Path, name: str = "tiny_sn", scale: int = 1, sources: tuple[str, ...] | None = CLUSTER_SOURCES,
                 **changes: object) -> str:
    """The text of a slice of recipes/tiny.yaml (tests/e2e/slices.py) with only ``sources`` (None: all four);
    ``changes``: dotted overrides."""
    path = write_slice_recipe(tmp / f"{name}.yaml", tmp / "unused-root", name=name, scale=scale)
    data = yaml.safe_load(path.read_text())
    if sources is not None:
        keep_sources(data, sources)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    data.pop("storage_root", None)  # the root comes from TIDAL_STORAGE_ROOT, as in a deployment
    return yaml.safe_dump(data, sort_keys=False)


def tiny_recipe_text(name: str) -> str:
    """recipes/tiny.yaml as it is, named ``name``, without its storage_root (TIDAL_STORAGE_ROOT decides)."""
    data = yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())
    data["name"] = name
    data.pop("storage_root", None)  # the root comes from TIDAL_STORAGE_ROOT, as in a deployment
    return yaml.safe_dump(data, sort_keys=False)


def step_names(recipe_text: str, tmp: Path) -> list[tuple[str, str, str]]:
    """``(name, step_id, kind)`` of every step in plan order (ids do not depend on the root)."""
    from tidal.core.load import load_pipeline

    path = tmp / f"plan-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(recipe_text)
    pipe = load_pipeline(path, storage_root=str(tmp / "plan-root"))
    return [(step.name, step.step_id, step.kind) for step in pipe.graph]


def on_node(cluster: Cluster, node: str, recipe_text: str, args: list[str], *, root: str, check: bool = True,
            timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``tidal ARGS`` (recipe as ``recipe.yaml``) in a fresh node named ``node`` with storage root ``root``."""
    return on_node_argv(cluster, node, recipe_text, ["python", "-m", "tidal.cli", *args], root=root, check=check,
                        timeout=timeout, env=env)


def on_node_argv(cluster: Cluster, node: str, recipe_text: str, argv: list[str], *, root: str, check: bool = True,
                 timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``argv`` in a fresh node (its cwd holds the recipe as ``recipe.yaml``), storage root ``root``."""
    return cluster.node(node).run(["bash", "-c", NODE_SCRIPT, "node", *argv], input=recipe_text, check=check,
                                  timeout=timeout, env={"TIDAL_STORAGE_ROOT": root, **(env or {})})


def xcom_locations(prepared: dict) -> list[str]:
    """Every location a prepare task handed over (what the next tasks get as arguments)."""
    found = [prepared.get("step_uri"), prepared.get("out"), prepared.get("config"),
             *(prepared.get("inputs") or {}).values()]
    return [str(f) for f in found if f]


def job_argv(name: str, kind: str, prepared: dict) -> list[str]:
    """The launch task's command for step ``name`` from its prepare's XCom (the trainer, or the kind's job)."""
    from tidal.kinds import kind_spec

    if kind == "train":
        return ["python", "-m", "tidal.train", prepared["step_uri"]]
    return ["python", "-m", kind_spec(kind).module, "--config", prepared["config"], "--out", prepared["out"],
            "--name", name, *(f"--input={n}={u}" for n, u in sorted(prepared["inputs"].items()))]


def run_split(cluster: Cluster, recipe_text: str, name: str, kind: str, *, root: str, run_key: str, index: int,
              env: dict[str, str] | None = None, launch: Callable[[dict], list[str]] | None = None,
              check: bool = True, timeout: float = 900) -> tuple[str, dict]:
    """One step as Airflow runs it on a cluster: prepare, launch and commit, each on a fresh node; the
    prepare's XCom (JSON) is all the launch and commit nodes get. ``launch`` turns the XCom into the
    launch command (default :func:`job_argv`); with ``check=False`` a failed launch returns before
    the commit; ``timeout``: seconds the launch may take (then NodeTimeout). Returns (output, the XCom)."""
    proc = on_node_argv(cluster, f"prep-{index}", recipe_text, ["python", "-c", PREPARE, name], root=root, env=env)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("XCOM"))
    prepared = json.loads(line.removeprefix("XCOM"))
    out = proc.stdout + proc.stderr
    if prepared["status"] == "run":
        argv = launch(prepared) if launch else job_argv(name, kind, prepared)
        proc = on_node_argv(cluster, f"launch-{index}", recipe_text, argv, root=root, env=env, check=check,
                            timeout=timeout)
        out += proc.stdout + proc.stderr
        if proc.returncode != 0:
            return out, prepared
    proc = on_node_argv(cluster, f"commit-{index}", recipe_text,
                        ["python", "-c", COMMIT, name, json.dumps(prepared), run_key], root=root, env=env)
    return out + proc.stdout + proc.stderr, prepared


def bucket_markers(cluster: Cluster, root: str) -> dict[str, str]:
    """step id -> ``_SUCCESS`` body (the manifest root hash) of every committed step under ``root``."""
    prefix = root.removeprefix(f"s3://{BUCKET}/").strip("/") + "/"
    client = cluster.s3()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(prefix):]
            if rel.count("/") == 1 and rel.endswith("/_SUCCESS") and not rel.startswith("."):
                body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read().decode().strip()
                out[rel.split("/")[0]] = body
    return out


def local_markers(root: Path) -> dict[str, str]:
    """step id -> ``_SUCCESS`` body of every committed step under a local root."""
    return {p.parent.name: p.read_text().strip() for p in sorted(root.glob("*/_SUCCESS"))}


WALL_CLOCK_KINDS = ("gate", "train")  # outputs carry timings (Data Docs times, tokens/s): compared by content


def _bucket_file(cluster: Cluster, root: str, step_id: str, name: str) -> bytes:
    prefix = root.removeprefix(f"s3://{BUCKET}/").strip("/")
    return cluster.s3().get_object(Bucket=BUCKET, Key=f"{prefix}/{step_id}/{name}")["Body"].read()


def _deterministic_part(kind: str, read) -> object:
    """What must be equal between any two runs of a gate or train step (as tests/e2e/test_determinism.py)."""
    if kind == "gate":
        return json.loads(read("gate_result.json"))
    summary = json.loads(read("summary.json"))
    curve = [(r["step"], r["loss"]) for r in map(json.loads, read("metrics.jsonl").decode().splitlines())
             if "loss" in r]  # the step-0 line holds the initial evaluation only
    return {"params_sha256": summary["params_sha256"], "final_train_loss": summary["final_train_loss"],
            "curve": curve}


def differences(cluster: Cluster, root: str, local_root: Path, steps: list[tuple[str, str, str]]) -> dict[str, str]:
    """step name -> what differs between the cluster run and the local run (empty: identical). Data steps
    compare manifest root hashes; gate and train their deterministic content (:data:`WALL_CLOCK_KINDS`)."""
    remote, local = bucket_markers(cluster, root), local_markers(local_root)
    out = {}
    for name, step_id, kind in steps:
        if step_id not in remote or step_id not in local:
            out[name] = f"not committed (cluster: {step_id in remote}, local: {step_id in local})"
        elif kind in WALL_CLOCK_KINDS:
            mine = _deterministic_part(kind, lambda n, sid=step_id: _bucket_file(cluster, root, sid, n))
            theirs = _deterministic_part(kind, lambda n, sid=step_id: (local_root / sid / n).read_bytes())
            if mine != theirs:
                out[name] = "deterministic content differs"
        elif remote[step_id] != local[step_id]:
            out[name] = f"manifest root hash {remote[step_id][:12]} != local {local[step_id][:12]}"
    return out


def bench_workdir(prefix: str) -> Path | None:
    """A fresh folder under /var/tmp for a cluster benchmark, or None (after one ``error:`` line) when
    this machine cannot host the test cluster."""
    import tempfile

    from tests.cluster.harness import namespaces_unavailable

    reason = namespaces_unavailable()
    if reason:
        print(f"error: the test cluster cannot start here: {reason}", file=sys.stderr)
        return None
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))


def run_local(recipe_text: str, tmp: Path, env: dict[str, str], root: Path | None = None) -> tuple[Path, float]:
    """The same recipe in one process on a local root (the reference); returns (root, seconds).
    ``root``: that local root (default ``tmp/local-root``); steps already committed there are skipped,
    so references of recipes that share steps are computed once (tests/cluster/conftest.py). Runs on one
    root take turns (an exclusive ``flock`` beside it): the root is shared by the suite's xdist workers, and
    the embedded MLflow store it holds must not be created by two processes at once."""
    import fcntl

    root = root or tmp / "local-root"
    path = tmp / "local.yaml"
    path.write_text(recipe_text)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tick = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tidal.cli", "run", str(path), "--storage-root", str(root)],
                       check=True, cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
    return root, time.perf_counter() - tick


@dataclass
class ClusterRun:
    """What running every step on its own node gave."""

    root: str
    seconds: float
    per_step: dict[str, float] = field(default_factory=dict)
    fetched: dict[str, int] = field(default_factory=dict)  # step name -> bytes read from the bucket
    outputs: dict[str, str] = field(default_factory=dict)
    xcoms: dict[str, dict] = field(default_factory=dict)  # split steps: what prepare handed over
    nodes: int = 0  # fresh nodes booted
    injected: dict[int, int] = field(default_factory=dict)  # HTTP status -> errors the proxy answered instead of S3


def run_on_nodes(cluster: Cluster, recipe_text: str, steps: list[tuple[str, str, str]], *, root: str,
                 run_key: str, split_each: bool = True, faults_every: int = 0) -> ClusterRun:
    """Every step on fresh nodes, in plan order; the nodes share only the cluster's services. Beam steps
    and training run as prepare / launch / commit on three nodes (:func:`run_split`), the others as
    ``tidal run --step`` on one; with ``split_each`` False only the first step of each such kind is split
    (a kind's hand-over is the same code for each of its steps; the rest run on one node each). Returns
    wall times, the XComs, and the bytes each step's nodes fetched from the bucket (counted by a proxy in
    front of it). With ``faults_every`` N > 0 that proxy answers every N-th request with S3's 500
    InternalError or 503 SlowDown instead of forwarding it (N = 20: 5 % of the bucket's calls fail once),
    as object stores do routinely; the counts are in ``injected``."""
    result = ClusterRun(root, 0.0)
    tick = time.perf_counter()
    moto_port = int(cluster.s3_endpoint.rsplit(":", 1)[1])
    split_kinds_seen: set[str] = set()
    for index, (name, _, kind) in enumerate(steps):
        # counts what this step's nodes fetch from the bucket
        proxy = FaultProxy(moto_port, FaultPlan(every=faults_every), host=cluster.service_host).start()
        env = {"TIDAL_S3_ENDPOINT_URL": proxy.endpoint}
        try:
            start = time.perf_counter()
            if kind in SPLIT_KINDS and (split_each or kind not in split_kinds_seen):
                split_kinds_seen.add(kind)
                result.outputs[name], result.xcoms[name] = run_split(cluster, recipe_text, name, kind, root=root,
                                                                     run_key=run_key, index=index, env=env)
                result.nodes += 3 if result.xcoms[name]["status"] == "run" else 2
            else:
                result.nodes += 1
                proc = on_node(cluster, f"node-{index}", recipe_text, ["run", "recipe.yaml", "--step", name,
                                                                     "--run-key", run_key], root=root, env=env)
                result.outputs[name] = proc.stdout + proc.stderr
            result.per_step[name] = time.perf_counter() - start
        finally:
            proxy.stop()
        result.fetched[name] = proxy.plan.get_bytes
        for status, count in proxy.plan.injected.items():
            result.injected[status] = result.injected.get(status, 0) + count
    result.seconds = time.perf_counter() - tick
    return result


def input_bytes(cluster: Cluster, root: str, recipe_text: str, tmp: Path,
                names: tuple[str, ...] | None = None) -> dict[str, int]:
    """step name -> total bytes of its committed inputs (their manifests), the denominator of bytes_read_ratio;
    for the steps ``names`` only (default: every step, all of whose inputs must be committed)."""
    from tidal.core.load import load_pipeline

    path = tmp / "inputs.yaml"
    path.write_text(recipe_text)
    pipe = load_pipeline(path, storage_root=str(tmp / "plan-root"))
    prefix = root.removeprefix(f"s3://{BUCKET}/").strip("/")
    client = cluster.s3()
    sizes: dict[str, int] = {}

    def total(step_id: str) -> int:
        if step_id not in sizes:
            body = client.get_object(Bucket=BUCKET, Key=f"{prefix}/{step_id}/manifest.json")["Body"].read()
            sizes[step_id] = sum(entry["bytes"] for entry in json.loads(body)["files"])
        return sizes[step_id]

    return {step.name: sum(total(dep.step_id) for dep in step.inputs) for step in pipe.graph
            if names is None or step.name in names}
