"""Benchmark: training on the test cluster that loses its node three times, checkpoints in the bucket.

    .venv/bin/python bench/node_loss.py [--steps 200] [--checkpoint-every 10] [--seed 20261202]

Starts the test cluster (tests/cluster/harness.py) and trains the slice of recipes/tiny.yaml
(tests/cluster/train_scenario.py: a small model, one metrics line per step) with an ``s3://`` root,
twice: once uninterrupted, once with three node losses at steps drawn from ``--seed`` (SIGKILL of
the whole node, SIGTERM with a 30 s grace, SIGKILL), each attempt on a fresh node with an empty
disk. The baseline of the throughput ratio, measured in the same run, is the same recipe in one
process on a local root. Prints one line per trainer attempt and

    RESULT kills=3 resumed_from_bucket=true|false bitwise=true|false lost_steps_max=… goodput=…
           tokens_per_s_stream_vs_local=… gets_per_step_per_host=… ckpt_upload_MBps=… ckpt_upload_vs_raw_put=…

``resumed_from_bucket``: every attempt after a loss started from the newest checkpoint that had
reached the bucket (the SIGTERM one from the step it stopped at) and fetched it from there.
``bitwise``: both cluster runs' parameters (sha256) and whole loss curves equal the local run's.
``lost_steps_max``: the most steps re-done after one loss (the last step printed minus the step
resumed from). ``goodput``: productive step seconds (steps x the uninterrupted run's mean step time)
over the wall seconds of all the interrupted run's trainer attempts (process start, compile, restore,
re-done steps and checkpoint waits are the badput; ``goodput_uninterrupted``: the same for the
run without losses). ``tokens_per_s_stream_vs_local``: tokens/s of
the uninterrupted cluster run (token rows read by range requests from the bucket, checkpoints
uploaded) over the local run's (memory-mapped shards); on this one machine the S3 server (moto, Python)
shares the trainer's cores, so ``tokens_per_cpu_s_stream_vs_local`` (tokens per CPU second of the
trainer process, its reading and uploading threads included) says what the streaming costs the
trainer itself. ``gets_per_step_per_host``: ranged GETs of token rows the uninterrupted cluster run's trainer
sent per step (``data_gets_per_step`` of its summary); the runs read with ``train.block_reads`` (blocks of
``--block-bytes``, 2 per window) unless ``--block-bytes 0`` (shuffled single rows). ``ckpt_upload_MBps``:
bytes of checkpoints the uninterrupted run uploaded over the seconds the uploads took (10^6 B/s, while training);
``ckpt_upload_vs_raw_put``: that rate over boto3 ``put_object`` of the same files, one after the
other, to the same server from an idle process. Needs root and PostgreSQL (``make services``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import scenario as sc
from tests.cluster import train_scenario as ts
from tests.cluster.harness import BUCKET, Cluster


def _raw_put_MBps(cluster: Cluster, root: str, step_id: str) -> float:
    """boto3 put_object of the committed step's newest checkpoint files, one after the other."""
    client = cluster.s3()
    manifest = json.loads(sc._bucket_file(cluster, root, step_id, "manifest.json"))
    newest = max(int(e["path"].split("/")[1]) for e in manifest["files"] if e["path"].startswith("checkpoints/"))
    names = [e["path"] for e in manifest["files"] if e["path"].startswith(f"checkpoints/{newest}/")]
    bodies = [sc._bucket_file(cluster, root, step_id, name) for name in names]
    prefix = f"raw-put-{uuid.uuid4().hex[:8]}"
    tick = time.perf_counter()
    for name, body in zip(names, bodies, strict=True):
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body)
    seconds = time.perf_counter() - tick
    return sum(map(len, bodies)) / seconds / 1e6


def main() -> int:
    """Run both trainings and print the attempt lines and the RESULT line; exit 1 if not bitwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20261202, help="draws the three loss steps")
    parser.add_argument("--block-bytes", type=int, default=1 << 20, help="train.block_reads.block_bytes; 0: "
                        "shuffled single rows")
    args = parser.parse_args()
    tmp = sc.bench_workdir("node-loss-")
    if tmp is None:
        return 1
    blocks = {"train.block_reads": {"block_bytes": args.block_bytes}} if args.block_bytes else {}
    text = ts.train_recipe(tmp, steps=args.steps, checkpoint_every=args.checkpoint_every, sources=None, **blocks)
    steps = sc.step_names(text, tmp)
    train = [s for s in steps if s[2] == "train"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDAL_STORAGE", "TIDAL_S3", "MLFLOW_", "AWS_"))}
    local_root, _ = sc.run_local(text, tmp, env)
    local = json.loads((local_root / train[0][1] / "summary.json").read_text())
    targets = sorted(random.Random(args.seed).sample(range(args.checkpoint_every + 3, args.steps - 40), 3))
    losses = list(zip(["SIGKILL", "SIGTERM", "SIGKILL"], targets, strict=True))
    with Cluster.start(tmp / "cluster") as cluster:
        root_a, root_b = (f"s3://tidal/nl-bench-{uuid.uuid4().hex[:8]}" for _ in range(2))
        clean = ts.run_with_losses(cluster, text, steps, root=root_a, run_key="nl-a", losses=[],
                                   workdir=Path(tempfile.mkdtemp(dir=tmp)))
        lossy = ts.run_with_losses(cluster, text, steps, root=root_b, run_key="nl-b", losses=losses,
                                   workdir=Path(tempfile.mkdtemp(dir=tmp)))
        bitwise = not sc.differences(cluster, root_a, local_root, train) and \
            not sc.differences(cluster, root_b, local_root, train)
        summary = json.loads(sc._bucket_file(cluster, root_a, train[0][1], "summary.json"))
        raw = _raw_put_MBps(cluster, root_a, train[0][1])
    resumed, lost = True, []
    for before, after in zip(lossy.attempts, lossy.attempts[1:], strict=False):
        every = args.checkpoint_every
        expected = ({before.preempted_at} if before.lost == "SIGTERM"
                    else ts.resumable(before.counted, before.resumed_from or 0, before.last_step, every))
        fetched = f"read checkpoint {after.resumed_from} from" in after.log
        resumed = resumed and fetched and after.resumed_from in expected
        lost.append(before.last_step - (after.resumed_from or 0))
    for a in lossy.attempts:
        print(f"attempt {a.node}: lost {a.lost or '-':>7} at step {a.target or '-':>4}  resumed from "
              f"{a.resumed_from if a.resumed_from is not None else '-':>4}  last step {a.last_step:>4}  "
              f"rc {a.returncode:>4}  {a.seconds:6.1f} s  checkpoints counted {len(a.counted)}")
    productive = args.steps * summary["step_time_s"]
    goodput = productive / sum(a.seconds for a in lossy.attempts)
    goodput_clean = productive / sum(a.seconds for a in clean.attempts)  # start, compile, eval, commit wait
    upload = summary.get("checkpoint_upload_MBps", 0.0)
    cpu = summary["loop_tokens_per_cpu_second"] / local["loop_tokens_per_cpu_second"]
    print(f"RESULT kills=3 resumed_from_bucket={str(resumed).lower()} bitwise={str(bitwise).lower()} "
          f"lost_steps_max={max(lost)} goodput={goodput:.3f} goodput_uninterrupted={goodput_clean:.3f} "
          f"tokens_per_s_stream_vs_local={summary['tokens_per_second'] / local['tokens_per_second']:.3f} "
          f"tokens_per_cpu_s_stream_vs_local={cpu:.3f} "
          f"gets_per_step_per_host={summary.get('data_gets_per_step', float('nan')):.3f} "
          f"ckpt_upload_MBps={upload:.1f} ckpt_upload_vs_raw_put={upload / raw:.3f}")
    return 0 if bitwise and resumed else 1


if __name__ == "__main__":
    sys.exit(main())
