"""Benchmark: sharded checkpoints of a multi-process run, straight to a bucket (tidal/train/shards.py).

    .venv/bin/python bench/checkpoint_scale.py [--hosts 4] [--scale 8192] [--restore-hosts 2] [--list] [--store gs]

Starts moto (an S3 server on loopback; ``--store gs``: fake-gcs-server, GCS's JSON API) and ``--hosts``
processes over jax.distributed (gloo, one CPU device each, mesh fsdp=hosts), each the worker of
tests/train/shards_worker.py: it builds only its own shards of a train-state-like pytree (``--scale`` x 28
KiB: float32 embeddings, weights and Adam moments sharded over fsdp; a replicated bf16 bias and step count; an
all-zero leaf), saves it as one checkpoint through the trainer's Checkpointer (each process writes its own
shards, process 0 the manifest last), then PUTs the same bytes with the store's own client (boto3,
google-cloud-storage) from the same processes (the baseline, same run). Then ``--restore-hosts`` processes
with 2 devices each and mesh fsdp x tensor=2 (another process count and split) restore it and check every
shard bit for bit. Prints

    RESULT store=s3|gs hosts=… state_MB=… peak_host_rss_over_state=… peak_host_rss_beyond_devices_over_state=…
           stall_s_per_save=… save_MBps=… save_vs_raw_put=… restore_MBps=… resharded_restore=true|false
           bitwise=true|false

``peak_host_rss_over_state``: the largest process's peak resident memory while it saved (or restored),
sampled every 5 ms, above what it held before it built (or read) any of the state (the interpreter and
JAX: ~240 MB here, the same in every process), over the whole state's bytes: its own share of the state
plus what the save or restore needs beside it; the aim is at most 1/hosts + 0.1.
``peak_host_rss_beyond_devices_over_state``: the same less the bytes of that process's own device arrays of
the state (its shards, on every device it drives): on a TPU or GPU host those are in HBM, on this CPU backend
they are host memory, so this is what the host's RAM holds beside them (a save's host copy, a restore's chunks
in flight, the allocator's retained free memory).
Each process saves twice (steps 99 and 100) and the second save is measured, as training repeats saves: the
first pays one-time costs (the bucket clients, ~0.7 s for boto3's; TensorStore's connections), which the
baseline pays before its clock starts too. ``stall_s_per_save``: the seconds ``save`` blocked the slowest
process (the device-to-host copy; on the CPU backend with a never-donated state, only bookkeeping).
``save_MBps``: the state's bytes (10^6) over the slowest process's seconds from ``save`` to its shards written
(process 0: to the manifest written). ``save_vs_raw_put``: that over the rate of the plain PUTs of the same
shards (8 at a time per process, as the save writes them) by the same processes. ``restore_MBps``: the state's
bytes over the slowest restoring process's seconds. On this 2-core machine the server (moto: Python;
fake-gcs-server: Go) shares the cores with the processes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import boto3
import numpy as np

from tests.ports import free_port
from tests.storage.servers import FakeGcsServer, MotoServer
from tests.train.shards_worker import shapes


def run(server: MotoServer | FakeGcsServer, mode: str, location: str, processes: int, devices: int, fsdp: int,
        tensor: int, scale: int, env: dict[str, str]) -> list[dict]:
    port = free_port()
    base = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
            **_store_env(server), "PYTHONPATH": str(REPO), **env}
    procs = []
    for pid in range(processes):
        dist = {"JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": str(processes),
                "JAX_PROCESS_ID": str(pid)} if processes > 1 else {}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.train.shards_worker", mode, location, "100", str(fsdp), str(tensor),
             str(scale)], env={**base, **dist}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO))
    results = []
    for proc in procs:
        text = proc.communicate(timeout=1800)[0]
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            sys.exit(f"error: {mode} process exited {proc.returncode}:\n{text[-3000:]}")
        for x in text.splitlines():
            if "counts: in the bucket" in x or "read checkpoint" in x:
                print(x, flush=True)
        results.append(json.loads(line[7:]))
    return results


def _store_env(server: MotoServer | FakeGcsServer) -> dict[str, str]:
    if isinstance(server, FakeGcsServer):
        return server.env
    return {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
            "TIDAL_S3_ENDPOINT_URL": server.endpoint}


def _layout(server: MotoServer | FakeGcsServer, bucket: str, prefix: str) -> dict[str, int]:
    """The checkpoint's objects in the bucket: key after ``prefix`` -> bytes."""
    if isinstance(server, FakeGcsServer):
        keys = server.keys(bucket, prefix)
    else:
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
        keys = {obj["Key"]: obj["Size"] for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix) for obj in page.get("Contents", [])}
    return {key.removeprefix(prefix): size for key, size in sorted(keys.items()) if "/raw-put/" not in key}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--scale", type=int, default=8192, help="x 28 KiB of state")
    parser.add_argument("--restore-hosts", type=int, default=2)
    parser.add_argument("--list", action="store_true", help="print the checkpoint's objects and sizes")
    parser.add_argument("--store", choices=("s3", "gs"), default="s3", help="moto (s3://) or fake-gcs-server (gs://)")
    args = parser.parse_args()
    state_bytes = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d, _ in shapes(args.scale).values())
    server = (MotoServer() if args.store == "s3" else FakeGcsServer()).start()
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        if isinstance(server, FakeGcsServer):
            server.create_bucket(bucket)
        else:
            boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id="bench",
                         aws_secret_access_key="bench").create_bucket(Bucket=bucket)
        location = f"{args.store}://{bucket}/.staging/train-bench/"
        saved = run(server, "save", location, args.hosts, 1, args.hosts, 1, args.scale,
                    {"SHARDS_RAW_PUT": "1", "SHARDS_WARM_SAVE": "1"})
        if args.list:  # the layout of the checkpoint in the bucket, with sizes
            for key, size in _layout(server, bucket, location.removeprefix(f"{args.store}://{bucket}/")).items():
                print(f"LAYOUT {size:>12} {key}", flush=True)
        restored = run(server, "restore", location, args.restore_hosts, 2, args.restore_hosts, 2, args.scale, {})
    finally:
        server.stop()
    save_s = max(r["save_s"] for r in saved)
    raw_s = max(r["raw_put_s"] for r in saved)
    restore_s = max(r["restore_s"] for r in restored)
    peak = max([r["peak_rss_in_save_bytes"] - r["rss_before_bytes"] for r in saved]
               + [r["peak_rss_in_restore_bytes"] - r["rss_before_bytes"] for r in restored])
    beyond = max([r["peak_rss_in_save_bytes"] - r["rss_before_bytes"] - r["device_bytes"] for r in saved]
                 + [r["peak_rss_in_restore_bytes"] - r["rss_before_bytes"] - r["device_bytes"] for r in restored])
    bitwise = all(r["step"] == 100 and not r["wrong"] for r in restored)
    print(json.dumps({"save": saved, "restore": restored}), flush=True)
    print(f"RESULT store={args.store} hosts={args.hosts} state_MB={state_bytes / 1e6:.1f} "
          f"peak_host_rss_over_state={peak / state_bytes:.3f} "
          f"peak_host_rss_beyond_devices_over_state={beyond / state_bytes:.3f} "
          f"stall_s_per_save={max(r['blocking_s'] for r in saved):.3f} save_MBps={state_bytes / 1e6 / save_s:.1f} "
          f"save_vs_raw_put={raw_s / save_s:.2f} restore_MBps={state_bytes / 1e6 / restore_s:.1f} "
          f"resharded_restore={'true' if bitwise and args.restore_hosts != args.hosts else 'false'} "
          f"bitwise={'true' if bitwise else 'false'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
