"""Schedules and the training data's read pattern (issue 41), measured in one run on this machine.

* ``decay_branch_bitwise``: an 8-step WSD trunk (committed by the real runner) branched at its stable
  checkpoint 4 into a 2-step decay (``continue_from.schedule: decay``) against a straight 6-step WSD run
  that decays over its last 2 steps: every logged loss and every final parameter equal.
* ``gets_per_step_per_host`` / ``rows_gets_per_step_per_host``: ranged GETs the trainer sends to an S3
  server on loopback (moto) per training step, with ``train.block_reads`` (defaults: blocks of 1 MiB, 2
  per window) and with shuffled single rows (today's default order), batch 16 on one host.
* ``stream_vs_local``: tokens/s of the block-read run from the bucket over the same run's tokens/s from a
  local root (the same mixture, the tiny model of tests/train/test_train_e2e.py, in this process).

Not measured yet: ``mix_reweight_bytes_ratio`` and ``stage_counts_exact`` (load-time mixing, issue 41
item 2, is not built); the line leaves them out rather than print a number for them.

Usage: ``.venv/bin/python bench/train_schedule.py [--sequences 8192] [--steps 200]``. Ends with
``RESULT decay_branch_bitwise=true|false gets_per_step_per_host=… rows_gets_per_step_per_host=…
stream_vs_local=…``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "train")]  # the test modules import each other by name


def decay_branch_bitwise(root: Path) -> bool:
    """The trunk, its branch through the runner and the straight run (tests/train/test_continue.py's)."""
    import numpy as np
    from test_continue import branch_and_straight
    from test_train_e2e import committed_inputs, final_params, losses

    storage, inputs = committed_inputs(root)
    located = {step.name: storage.step_dir(step.step_id) for step in inputs}
    _, branch, straight = branch_and_straight(storage, inputs, located, root / "straight")
    out = storage.step_dir(branch.step_id)
    got, want = final_params(out), final_params(straight)
    return losses(out) == losses(straight) and got.keys() == want.keys() and all(
        np.array_equal(got[k], want[k]) for k in want)


def train_once(out: Path, inputs: dict[str, str], config: dict) -> dict:
    """The tiny model trained in this process on ``inputs`` (local paths or bucket URIs); its summary."""
    from test_train_e2e import make_ctx

    import tidal.train
    from tidal.train.trainer import train

    ctx = make_ctx(out, {name: Path("/unused") for name in inputs}, config)
    spec = tidal.train.write_spec(ctx)
    spec["inputs"] = dict(inputs)
    (out / "spec.json").write_text(tidal.train.spec_text(spec))
    return train(out, spec, log=logging.getLogger("bench.train_schedule"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=8192, help="sequences in the mixture (33 tokens each)")
    parser.add_argument("--steps", type=int, default=200, help="training steps per run")
    args = parser.parse_args()

    import boto3
    from test_train_e2e import CONFIG, build_inputs, write_tokens

    from tests.storage.servers import MotoServer
    from tidal.files.step_files import ranged_gets

    work = Path(tempfile.mkdtemp(prefix="tidal-train-schedule-"))
    server = MotoServer().start()
    try:
        (work / "branch").mkdir()
        bitwise = decay_branch_bitwise(work / "branch")
        print(f"decay branch at 4 of an 8-step WSD trunk == straight 6-step WSD run: {bitwise}", flush=True)

        data = work / "data"
        build_inputs(data)
        shutil.rmtree(data / "mix")
        write_tokens(data / "mix", args.sequences, seed=1, meta_name="mixture.json", shards=4)
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                          TIDAL_S3_ENDPOINT_URL=server.endpoint)
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="bench")
        for path in sorted(p for p in data.rglob("*") if p.is_file()):
            client.upload_file(str(path), "bench", f"inputs/{path.relative_to(data).as_posix()}")
        local = {name: str(data / name) for name in ("tokenizer", "mix", "tokenize-udhr")}
        bucket = {name: f"s3://bench/inputs/{name}/" for name in local}
        base = {**CONFIG, "steps": args.steps, "batch_size": 16, "checkpoint_every": args.steps,
                "eval_every": args.steps, "log_every": args.steps, "optimizer": {**CONFIG["optimizer"],
                                                                                 "warmup_steps": 10}}
        blocks = {**base, "block_reads": {"block_bytes": 1 << 20, "window_blocks": 2}}
        results = {}
        for name, config, where in (("warm-up", blocks, local), ("local", blocks, local),
                                    ("bucket", blocks, bucket), ("bucket-rows", base, bucket)):
            before, tick = ranged_gets(), time.perf_counter()
            summary = train_once(work / name, where, config)
            results[name] = {"tokens_per_s": summary["tokens_per_second"], "gets": ranged_gets() - before,
                             "seconds": time.perf_counter() - tick}
            print(f"{name}: {json.dumps(results[name])}", flush=True)
        gets = results["bucket"]["gets"] / args.steps
        rows_gets = results["bucket-rows"]["gets"] / args.steps
        ratio = results["bucket"]["tokens_per_s"] / results["local"]["tokens_per_s"]
        print(f"RESULT decay_branch_bitwise={str(bitwise).lower()} gets_per_step_per_host={gets:.3f} "
              f"rows_gets_per_step_per_host={rows_gets:.2f} stream_vs_local={ratio:.3f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
