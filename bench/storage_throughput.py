"""Benchmark: upload and download throughput through tidal's S3 client against a loopback moto server.

    .venv/bin/python bench/storage_throughput.py [--small-count 32] [--large-mb 200] [--repeats 2]

Starts ``python -m moto.server`` on a free loopback port, then moves objects of 1 MB and
200 MB (MB = 10^6 bytes here, throughput in MB/s = bytes / 10^6 / seconds) with the same
boto3 client and transfer settings steps use (:func:`tidal.storage.s3.s3_client`,
:func:`tidal.storage.s3.transfer_config`: adaptive retries, multipart above 64 MiB in 16 MiB
parts, 8 parallel transfers). 1 MB objects go ``--small-count`` at a time through a pool of
8 threads, as a step commit uploads its files; the 200 MB object alone (multipart). Each
figure is the best of ``--repeats``. The baseline, measured in the same run on the same
files: a local-disk copy (``shutil.copyfile``). Prints

    RESULT up_1mb_MBps=… down_1mb_MBps=… up_200mb_MBps=… down_200mb_MBps=… ratio_vs_local_copy=…

``ratio_vs_local_copy`` is the 200 MB upload rate over the 200 MB local copy rate. moto
keeps objects in memory in one Python process, so these figures measure the client, the
HTTP stack and moto on loopback, not a real bucket's network.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tidal.storage import StorageSettings
from tidal.storage.s3 import s3_client, transfer_config

MB = 10**6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"moto server did not listen on {port} within 60 s")


def best_rate(total_bytes: int, repeats: int, fn) -> float:
    """Best MB/s of ``repeats`` calls of ``fn`` moving ``total_bytes``."""
    best = float("inf")
    for _ in range(repeats):
        tick = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - tick)
    return total_bytes / MB / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small-count", type=int, default=32, help="number of 1 MB objects per round")
    parser.add_argument("--large-mb", type=int, default=200, help="size of the large object (MB)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per figure (best is kept)")
    args = parser.parse_args()

    port = free_port()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      TIDAL_S3_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    moto = start_moto(port)
    settings = StorageSettings()
    client, config = s3_client(settings), transfer_config(settings)
    bucket = "tidal-bench"
    client.create_bucket(Bucket=bucket)
    rng = np.random.default_rng(0)
    try:
        with tempfile.TemporaryDirectory(prefix="tidal-s3-bench-") as tmp:
            tmp = Path(tmp)
            small = []
            for i in range(args.small_count):
                path = tmp / f"small-{i:03d}.bin"
                path.write_bytes(rng.integers(0, 256, MB, dtype=np.uint8).tobytes())
                small.append(path)
            large = tmp / "large.bin"
            large.write_bytes(rng.integers(0, 256, args.large_mb * MB, dtype=np.uint8).tobytes())
            (tmp / "copy").mkdir()
            (tmp / "down").mkdir()
            pool = ThreadPoolExecutor(max_workers=settings.max_concurrency)

            def each(fn, paths):
                list(pool.map(fn, paths))

            up = lambda p: client.upload_file(str(p), bucket, p.name, Config=config)
            down = lambda p: client.download_file(bucket, p.name, str(tmp / "down" / p.name), Config=config)
            copy = lambda p: shutil.copyfile(p, tmp / "copy" / p.name)

            figures = {
                "local_copy_1mb_MBps": best_rate(len(small) * MB, args.repeats, lambda: each(copy, small)),
                "up_1mb_MBps": best_rate(len(small) * MB, args.repeats, lambda: each(up, small)),
                "down_1mb_MBps": best_rate(len(small) * MB, args.repeats, lambda: each(down, small)),
                "local_copy_200mb_MBps": best_rate(args.large_mb * MB, args.repeats, lambda: copy(large)),
                "up_200mb_MBps": best_rate(args.large_mb * MB, args.repeats, lambda: up(large)),
                "down_200mb_MBps": best_rate(args.large_mb * MB, args.repeats, lambda: down(large)),
            }
            pool.shutdown()
            head = client.head_object(Bucket=bucket, Key=large.name)
            assert head["ContentLength"] == args.large_mb * MB and "-" in head["ETag"], "expected a multipart object"
            assert (tmp / "down" / large.name).read_bytes() == large.read_bytes(), "download differs"
    finally:
        os.killpg(moto.pid, signal.SIGTERM)
        moto.wait(timeout=30)
    for key, value in figures.items():
        print(f"{key:24s} {value:10.1f} MB/s")
    ratio = figures["up_200mb_MBps"] / figures["local_copy_200mb_MBps"]
    print(f"RESULT up_1mb_MBps={figures['up_1mb_MBps']:.1f} down_1mb_MBps={figures['down_1mb_MBps']:.1f} "
          f"up_200mb_MBps={figures['up_200mb_MBps']:.1f} down_200mb_MBps={figures['down_200mb_MBps']:.1f} "
          f"ratio_vs_local_copy={ratio:.4f} local_copy_1mb_MBps={figures['local_copy_1mb_MBps']:.1f} "
          f"local_copy_200mb_MBps={figures['local_copy_200mb_MBps']:.1f}")


if __name__ == "__main__":
    main()
