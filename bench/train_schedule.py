"""Schedules and the training data's read pattern (issue 41), measured in one run on this machine.

* ``decay_branch_bitwise``: an 8-step WSD trunk (committed by the real runner) branched at its stable
  checkpoint 4 into a 2-step decay (``continue_from.schedule: decay``) against a straight 6-step WSD run
  that decays over its last 2 steps: every logged loss and every final parameter equal.
* ``gets_per_step_per_host`` / ``rows_gets_per_step_per_host``: ranged GETs the trainer sends to an S3
  server on loopback (moto) per training step, with ``train.block_reads`` (defaults: blocks of 1 MiB, 2
  per window) and with shuffled single rows (today's default order), batch 16 on one host.
* ``stream_vs_local``: tokens/s of the block-read run from the bucket over the same run's tokens/s from a
  local root (the same mixture, the tiny model of tests/train/test_train_e2e.py, in this process).

* ``mix_reweight_bytes_ratio``: bytes the mix step writes for a load-time mixture (``mixture.load_time``: its
  index, ``mixture.json``) after a weight change, over the bytes it writes for the same reweighted mixture
  copied (tokens), with three sources of ``--mix-sequences`` sequences of 2,048 tokens each.
* ``stage_counts_exact``: a three-stage load-time mixture of ``--stage-positions`` positions, every block
  recounted position by position against its stage's per-block counts (the mix step itself recounts a
  sample of blocks).

Usage: ``.venv/bin/python bench/train_schedule.py [--sequences 8192] [--steps 200]``. Ends with
``RESULT decay_branch_bitwise=true|false mix_reweight_bytes_ratio=… stage_counts_exact=true|false
gets_per_step_per_host=… rows_gets_per_step_per_host=… stream_vs_local=…``.
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
# the test modules import each other by name
sys.path[:0] = [str(REPO), str(REPO / "tests" / "train"), str(REPO / "tests" / "data")]


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


def mix_measures(root: Path, sequences: int, positions: int) -> tuple[float, bool]:
    """``(mix_reweight_bytes_ratio, stage_counts_exact)`` (module docstring)."""
    import numpy as np
    from test_mix import write_tokenize_step

    from tidal.context import StepContext
    from tidal.data import mix as mix_step
    from tidal.data.mixture_index import MixtureIndex

    seq = 2048
    sources = {"a": sequences, "b": sequences // 2, "c": sequences // 4}
    tokenized = {f"tokenize-{src}": write_tokenize_step(root / f"tokenize-{src}", i + 1, n, seq_len=seq)
                 for i, (src, n) in enumerate(sorted(sources.items()))}
    base = {"inputs": {s: f"tokenize-{s}" for s in sources}, "n_sequences": None, "shards": 4,
            "size": {"mode": "token_budget", "tokens": sequences * seq, "max_epochs": 4.0}}

    def written(name: str, **config) -> tuple[int, dict]:
        out = root / name
        out.mkdir()
        mix_step.run(StepContext("mix", "mix", "mix", {**base, **config}, out, tokenized, seed=3))
        return sum(p.stat().st_size for p in out.rglob("*") if p.is_file()), json.loads(
            (out / "mixture.json").read_text())

    reweighted = {"a": 0.3, "b": 0.3, "c": 0.4}
    copied, _ = written("copied", weights=reweighted)
    index_bytes, _ = written("index", weights=reweighted, load_time=True)
    stages = [{"weights": {"a": 0.6, "b": 0.4}, "until_fraction": 0.3},
              {"weights": reweighted, "until_fraction": 0.8}, {"weights": {"c": 0.9, "a": 0.1}}]
    _, staged = written("staged", weights=reweighted, load_time=True, stages=stages,
                        size={"mode": "token_budget", "tokens": positions * seq, "max_epochs": 10**6})
    index = MixtureIndex.from_json(staged["load_time"]["index"], staged["sources"])
    exact = True
    for first in range(0, positions - positions % index.block, 1 << 20):  # whole blocks, a million at a time
        stop = min(first + (1 << 20), positions - positions % index.block)
        blocks = (np.arange(first, stop) // index.block)
        labels = index.sources_of(np.arange(first, stop))
        found = np.zeros((blocks.max() + 1 - blocks.min(), len(index.sources)), np.int64)
        np.add.at(found, (blocks - blocks.min(), labels), 1)
        stage = np.searchsorted(index.starts, np.arange(blocks.min(), blocks.max() + 1), side="right") - 1
        exact &= bool(np.array_equal(found, index.counts[stage]))
    print(f"mix: copied {copied:,} bytes, load-time index {index_bytes:,} bytes; {positions:,} staged positions "
          f"in blocks of {index.block}: every block exact {exact}", flush=True)
    return index_bytes / copied, exact


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
    parser.add_argument("--mix-sequences", type=int, default=2000, help="sequences of 2,048 tokens of the "
                        "largest of the three mixed sources")
    parser.add_argument("--stage-positions", type=int, default=10_000_000, help="positions of the staged mixture "
                        "whose every block is recounted")
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
        (work / "mixes").mkdir()
        reweight_ratio, stages_exact = mix_measures(work / "mixes", args.mix_sequences, args.stage_positions)

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
        print(f"RESULT decay_branch_bitwise={str(bitwise).lower()} mix_reweight_bytes_ratio={reweight_ratio:.5f} "
              f"stage_counts_exact={str(stages_exact).lower()} gets_per_step_per_host={gets:.3f} "
              f"rows_gets_per_step_per_host={rows_gets:.2f} stream_vs_local={ratio:.3f}")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
