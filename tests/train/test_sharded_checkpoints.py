"""Multi-process sharded checkpoints against a real S3 server (moto on loopback) and a GCS emulator
(fake-gcs-server, GCS's JSON API): processes over jax.distributed (gloo, CPU devices) each write only their
own shards through TensorStore's s3 or gcs kvstore, process 0 writes the manifest last (boto3, or
google-cloud-storage for gs://), and the checkpoint restores bitwise onto another process count and
mesh; a process lost mid-save leaves arrays that never count and the next run resumes from the one before.
The worker: tests/train/shards_worker.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import boto3
import numpy as np
import pytest

from tests.ports import free_port
from tests.storage.servers import FakeGcsServer, MotoServer
from tests.train.shards_worker import shapes

pytestmark = pytest.mark.timeout(600)


class Bucket:
    """A bucket of either store, as the tests look at it: a URI prefix, its keys and sizes, one object's bytes,
    and the env that points a worker at the store."""

    def __init__(self, scheme: str, server: MotoServer | FakeGcsServer, name: str) -> None:
        self.scheme, self.server, self.name = scheme, server, name
        if scheme == "s3":
            self.client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                       aws_access_key_id="testing", aws_secret_access_key="testing")
            self.client.create_bucket(Bucket=name)
        else:
            server.create_bucket(name)

    @property
    def env(self) -> dict[str, str]:
        if self.scheme == "gs":
            return self.server.env
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1", "TIDAL_S3_ENDPOINT_URL": self.server.endpoint}

    def keys(self, prefix: str) -> dict[str, int]:
        if self.scheme == "gs":
            return self.server.keys(self.name, prefix)
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

    def read(self, key: str) -> bytes:
        if self.scheme == "gs":
            return self.server.read(self.name, key)
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()


@pytest.fixture(scope="module", params=["s3", "gs"])
def server(request):
    server = MotoServer() if request.param == "s3" else FakeGcsServer()
    server.start()
    yield request.param, server
    server.stop()


@pytest.fixture
def bucket(server) -> Bucket:
    return Bucket(*server, f"ckpt-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def location(bucket) -> str:
    return f"{bucket.scheme}://{bucket.name}/.staging/train-abc/"


def run(bucket: Bucket, mode: str, location: str, step: int, processes: int, devices: int, fsdp: int, tensor: int,
        env: dict[str, str] | None = None) -> list[tuple[int, str, dict | None]]:
    """Start ``processes`` workers (``devices`` CPU devices each) and return ``(exit code, output, RESULT)``."""
    port = free_port()
    base = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            **bucket.env, **(env or {})}
    procs = []
    for pid in range(processes):
        dist = ({"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": str(processes),
                 "JAX_PROCESS_ID": str(pid)} if processes > 1 else {})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.train.shards_worker", mode, location, str(step), str(fsdp), str(tensor)],
            env={**base, **dist}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    out = []
    for proc in procs:
        text = proc.communicate(timeout=300)[0]
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        out.append((proc.returncode, text, json.loads(line[7:]) if line else None))
    return out


def test_four_processes_write_their_own_shards_and_any_mesh_restores_them_bitwise(bucket, location):
    saved = run(bucket, "save", location, 10, processes=4, devices=2, fsdp=4, tensor=2)
    assert all(code == 0 for code, _, _ in saved), saved[0][1][-3000:]
    results = [r for _, _, r in saved]
    array_bytes = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d, _ in shapes(1).values())
    own = [r["own_bytes"] for r in results]
    # every byte written once, by the process owning it; no process wrote more than its share plus the
    # replicated leaves (the bf16 bias, the count), which only process 0 holds a replica 0 of
    assert sum(own) == array_bytes and max(own[1:]) <= array_bytes / 4, own
    assert "counts: in the bucket" in saved[0][1]
    prefix = location.split("/", 3)[3]
    keys = {key.removeprefix(prefix) for key in bucket.keys(prefix)}
    assert "checkpoint_manifests/10.json" in keys and {f"checkpoints/10/_shards/{p}.json" for p in range(4)} <= keys
    assert "checkpoints/10/params.embed/3.1" in keys  # fsdp=4 x tensor=2: one object per shard
    manifest = json.loads(bucket.read(f"{prefix}checkpoint_manifests/10.json"))
    assert manifest["processes"] == 4 and manifest["root_hash"] == results[0]["root_hash"]
    for processes, devices, fsdp, tensor in ((2, 4, 2, 4), (1, 1, 1, 1)):
        restored = run(bucket, "restore", location, 10, processes, devices, fsdp, tensor)
        for code, text, result in restored:
            assert code == 0 and result["step"] == 10 and result["wrong"] == [], text[-3000:]
            assert result["root_hash"] == manifest["root_hash"]
        if processes > 1:  # each read its own half of the sharded leaves, not the whole state
            assert all(r["read_bytes"] < 0.75 * array_bytes for _, _, r in restored), [r for _, _, r in restored]
            assert all("read checkpoint 10 from" in text for _, text, _ in restored)


def test_a_process_lost_mid_save_leaves_a_checkpoint_that_never_counts(bucket, location):
    first = run(bucket, "save", location, 10, processes=2, devices=2, fsdp=2, tensor=2)
    assert all(code == 0 for code, _, _ in first), first[0][1][-3000:]
    lost = run(bucket, "lose", location, 20, processes=2, devices=2, fsdp=2, tensor=2,
               env={"SHARDS_COMMIT_WAIT_S": "5"})
    code, text, _ = lost[0]
    assert code == 1 and "error: checkpoint of step 20" in text and "no record from processes [1] after 5 s" in text, \
        text[-3000:]
    prefix = location.split("/", 3)[3]
    keys = list(bucket.keys(f"{prefix}checkpoints/20/"))
    assert keys and not any(k.endswith("checkpoint_manifests/20.json") for k in keys)  # process 0's arrays only
    again = run(bucket, "restore", location, 0, processes=2, devices=2, fsdp=2, tensor=2)
    for code, text, result in again:
        assert code == 0 and result["step"] == 10 and result["wrong"] == [], text[-3000:]
    assert "checkpoint 20 at" in again[0][1] and "has arrays but no manifest" in again[0][1]
    assert bucket.keys(f"{prefix}checkpoints/20/") == {}
