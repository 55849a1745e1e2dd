"""How long `tidal verify` takes per GB, against `sha256sum` over the same files in the same run.

Generates a real committed step of ``--gb`` GB (default 1; ``--files`` files of incompressible
bytes) through the runner (so it has the manifest, step.json and a signature), then times:

* ``commit``: the runner's manifest hashing while committing (SHA-256, hashlib, 1 MiB reads);
* ``verify``: :func:`tidal.audit.verify.verify_step` (every file re-hashed, root hash, step id, HMACs);
* ``dependent check``: :func:`tidal.core.inputs.verify_inputs` of a step reading this one, the check
  every dependent makes by content at every run (issue 43 item 4: no cache), as ``dependent_check_MBps``;
* ``sha256sum``: the coreutils binary over the same files, one process (the baseline);
* ``hashlib``: SHA-256 of an in-memory 256 MiB buffer (the hash alone, no I/O).

Each timed figure is the median of ``--repeats`` runs with the files in the page cache (a
second read of freshly written files), so it measures hashing, not the disk. Ends with
``RESULT verify_s_per_GB=… ratio_vs_sha256sum=… … dependent_check_MBps=… dependent_check_vs_sha256sum=…``
(ratio > 1: slower than sha256sum).

Usage: ``.venv/bin/python bench/verify_throughput.py [--gb 1] [--files 8] [--repeats 3] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEP_VERSION = 1
MiB = 1 << 20


def run(ctx):
    """A bench step kind: ``files`` files of ``bytes_per_file`` pseudo-random bytes (seeded)."""
    import numpy as np

    rng = np.random.default_rng(ctx.seed)
    per_file, block = int(ctx.config["bytes_per_file"]), 16 * MiB
    for index in range(int(ctx.config["files"])):
        with open(ctx.out_dir / f"blob-{index:03d}.bin", "wb") as handle:
            left = per_file
            while left:
                n = min(block, left)
                handle.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
                left -= n
    return {"files": int(ctx.config["files"]), "bytes": per_file * int(ctx.config["files"])}


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="step size in GB (1e9 bytes)")
    parser.add_argument("--files", type=int, default=8, help="number of data files")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--dir", help="where to write the step (default: a temp dir, removed after)")
    args = parser.parse_args()

    from tidal.audit.verify import DEFAULT_WORKERS, verify_step
    from tidal.core.runner import run_step
    from tidal.integrity.signing import KEY_ENV, load_key
    from tidal.kinds import KINDS, KindSpec
    from tidal.steps import Step
    from tidal.storage import LocalStorage

    os.environ.setdefault(KEY_ENV, os.urandom(32).hex())  # signed, as in production
    KINDS["bench_blob"] = KindSpec("bench.verify_throughput", STEP_VERSION)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tidal-verify-bench-"))
    per_file = int(args.gb * 1e9 / args.files)
    step = Step("blob", "bench_blob", {"files": args.files, "bytes_per_file": per_file, "seed": 1})
    storage = LocalStorage(root)
    try:
        started = time.perf_counter()
        result = run_step(step, storage, force=True)
        total_s = time.perf_counter() - started
        out = result.out_dir
        data = sorted(str(p) for p in out.glob("blob-*.bin"))
        size = sum(Path(p).stat().st_size for p in data)
        gb = size / 1e9
        key = load_key()

        def verify(workers: int = DEFAULT_WORKERS) -> None:
            res = verify_step(out, step.step_id, key, require_signature=True, workers=workers)
            assert res.ok and res.signature == "valid", res.mismatches

        def sha256sum() -> None:
            subprocess.run(["sha256sum", *data], check=True, stdout=subprocess.DEVNULL)

        from tidal.integrity.hashing import build_manifest

        buffer = os.urandom(256 * MiB)
        verify(), sha256sum()  # warm the page cache and the binary
        verify_s = median_time(verify, args.repeats)
        verify1_s = median_time(lambda: verify(1), args.repeats)
        sum_s = median_time(sha256sum, args.repeats)
        manifest_s = median_time(lambda: build_manifest(out, exclude=("step.json", "_SUCCESS", "signature.json",
                                                                      "manifest.json")), args.repeats)
        mem_s = median_time(lambda: hashlib.sha256(buffer).hexdigest(), args.repeats)
        from tidal.core.inputs import verify_inputs

        dependent = Step("reader", "bench_blob", {"files": 1, "bytes_per_file": 1, "seed": 2}, inputs=(step,))
        dependent_s = median_time(lambda: verify_inputs(dependent, storage), args.repeats)
        cpu_flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        print(f"step {step.step_id}: {len(data)} files, {size:,} bytes ({gb:.3f} GB), written and committed in "
              f"{total_s:.1f} s")
        print(f"cpu: {os.cpu_count()} cores, SHA extensions (sha_ni): {'yes' if ' sha_ni' in cpu_flags else 'no'}; "
              f"{hashlib.sha256().name} via OpenSSL {__import__('ssl').OPENSSL_VERSION}")
        print(f"verify (tidal.audit.verify.verify_step, {DEFAULT_WORKERS} threads): {verify_s:.3f} s  "
              f"{gb / verify_s:.2f} GB/s")
        print(f"verify, 1 thread:                   {verify1_s:.3f} s  {gb / verify1_s:.2f} GB/s")
        print(f"manifest build (commit's hashing):  {manifest_s:.3f} s  {gb / manifest_s:.2f} GB/s")
        print(f"dependent's input check (inputs.py): {dependent_s:.3f} s  {gb / dependent_s:.2f} GB/s")
        print(f"sha256sum (coreutils, baseline):     {sum_s:.3f} s  {gb / sum_s:.2f} GB/s")
        print(f"hashlib sha256, 256 MiB in memory:   {mem_s:.3f} s  {0.268435456 / mem_s:.2f} GB/s")
        hash_share = (mem_s / 0.268435456) / (verify1_s / gb)  # pure SHA-256 time / verify time, per GB
        print(f"BLAKE3: not installed; pure SHA-256 is {100 * hash_share:.0f} % of 1-thread verify's time per GB, "
              f"so a hash N times faster would save at most {100 * hash_share:.0f} % x (1 - 1/N)")
        print(f"RESULT verify_s_per_GB={verify_s / gb:.3f} ratio_vs_sha256sum={verify_s / sum_s:.3f} "
              f"verify_1thread_s_per_GB={verify1_s / gb:.3f} sha256sum_s_per_GB={sum_s / gb:.3f} "
              f"hashlib_GB_per_s={0.268435456 / mem_s:.2f} threads={DEFAULT_WORKERS} "
              f"dependent_check_MBps={size / 1e6 / dependent_s:.0f} "
              f"dependent_check_vs_sha256sum={dependent_s / sum_s:.3f}")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
