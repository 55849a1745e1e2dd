"""Benchmark: tidal's trainer against a minimal hand-written flax+optax loop, with and without
checkpointing, and checkpoint write speed against ``dd`` on the same disk.

Same machine, same run, same model (tidal.train.model, the tiny recipe's shape by default),
same optimizer (``make_optimizer``), same batches (``BatchLoader``):

* hand loop: ``jax.jit`` of value_and_grad + ``tx.update`` over pre-built device batches;
  tokens/s over steps 2..N, wall clock (the first step compiles);
* tidal, checkpointing only at the end: :func:`tidal.train.trainer.train`'s
  ``loop_tokens_per_second`` (steps 2..N, wall clock, including its logging, evals and the
  final checkpoint);
* tidal with checkpoints every ``--checkpoint-every`` steps (asynchronous orbax saves).

``ratio_vs_dd`` = MB/s of one synchronous tidal Checkpointer save of ``--large-mib`` MiB of
random float32 (save call to files finalised by orbax) divided by ``dd if=/dev/zero
of=<same dir>/dd.tmp bs=1M count=<same MiB> conv=fsync`` MB/s; ``train_ckpt_ratio_vs_dd`` is
the same for the training run's own (small, fixed-overhead-dominated) asynchronous saves.
Each throughput is the best of ``--repeats`` interleaved rounds (the machine may be shared);
the write test first runs one warm-up round of each, printed but not counted (see main). The checkpoint test's
``--checkpoint-every 10`` saves every ~4-5 s of training here: a stress setting, 100x more
often than production runs save (every 10-60 min); ``checkpoint_interval_s`` reports it.
``median_round_ratio_with_checkpointing`` is the median of the rounds' tidal+ckpt / hand
ratios, a check on best-of-N luck; ``ckpt_vs_tidal`` (and ``cpu_ckpt_vs_tidal``) isolate what
the mid-run saves cost from what tidal's loop costs against the hand loop.
``cpu_ratio_*`` compare tokens per CPU second of the process (all threads; tidal's
``loop_tokens_per_cpu_second``): on a shared machine they move far less than wall-clock
ratios, and on a CPU-only host they include the CPU that asynchronous saves take from compute.
Targets (issue 4): ``ratio_with_checkpointing >= 0.97``, ``ratio_vs_dd >= 0.5``.

Prints ``RESULT hand_tokens_per_s=... tidal_tokens_per_s=... tidal_ckpt_tokens_per_s=...
ratio_vs_hand_loop=... ratio_with_checkpointing=... ckpt_mb_per_s=... dd_mb_per_s=... ratio_vs_dd=...``.

    .venv/bin/python bench/train_throughput.py [--steps 40] [--checkpoint-every 10] [--d-model 128]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

VOCAB, SEQ_LEN = 4096, 128


def make_inputs(root: Path, n_seq: int) -> dict[str, str]:
    """Random token data (uint16) in the layout of the mix/tokenize steps, plus tokenizer metadata."""
    rng = np.random.default_rng(0)
    tok = root / "tokenizer"
    tok.mkdir(parents=True)
    (tok / "tokenizer_meta.json").write_text(json.dumps({"tokenizer_hash": "b" * 64, "vocab_size": VOCAB}))
    for name, meta, n in (("mix", "mixture.json", n_seq), ("eval", "meta.json", 16)):
        d = root / name
        d.mkdir()
        np.save(d / "tokens-00000-of-00001.npy", rng.integers(0, VOCAB, (n, SEQ_LEN), dtype=np.uint16))
        (d / meta).write_text(json.dumps({"tokenizer_hash": "b" * 64, "seq_len": SEQ_LEN}))
    return {"tokenizer": str(tok), "mix": str(root / "mix"), "tokenize-eval": str(root / "eval")}


def config(args, checkpoint_every: int) -> dict:
    return {"model": {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": 4, "d_ff": 4 * args.d_model},
            "optimizer": {"lr": 3e-3, "min_lr_ratio": 0.1, "warmup_steps": 5, "weight_decay": 0.1,
                          "b1": 0.9, "b2": 0.95, "grad_clip": 1.0},
            "steps": args.steps, "batch_size": args.batch_size, "checkpoint_every": checkpoint_every,
            "eval_every": args.steps, "eval_batches": 1, "log_every": 10, "keep_checkpoints": 2,
            "train_data": "mix", "eval_data": {"eval": "tokenize-eval"}, "tokenizer": "tokenizer"}


def hand_loop(spec: dict) -> tuple[float, float]:
    """(tokens per wall second, tokens per CPU second of this process) of a plain jitted
    flax+optax loop on the same model, optimizer and batches."""
    import jax
    import optax

    from tidal.train.config import OptimizerConfig
    from tidal.train.loader import BatchLoader, TokenShards
    from tidal.train.model import ModelConfig, init_params, next_token_loss
    from tidal.train.optimizer import make_optimizer

    cfg = spec["config"]
    model_cfg = ModelConfig.model_validate(cfg["model"]).shape(VOCAB)
    tx, _ = make_optimizer(OptimizerConfig.model_validate(cfg["optimizer"]), cfg["steps"])
    loader = BatchLoader(TokenShards(spec["inputs"]["mix"], tokenizer_hash="b" * 64), cfg["batch_size"], 1)
    params = init_params(model_cfg, jax.random.key(0), SEQ_LEN - 1)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(next_token_loss)(params, model_cfg, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state, loss = step(params, opt_state, jax.device_put(loader.batch(0)))
    jax.block_until_ready(loss)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(1, cfg["steps"]):
        params, opt_state, loss = step(params, opt_state, jax.device_put(loader.batch(i)))
    jax.block_until_ready((params, loss))
    tokens = cfg["batch_size"] * (SEQ_LEN - 1) * (cfg["steps"] - 1)
    return tokens / (time.perf_counter() - start), tokens / (time.process_time() - cpu)


def tidal_run(spec: dict, step_dir: Path) -> dict:
    from tidal.train.config import parse_step_config
    from tidal.train.trainer import train

    step_dir.mkdir(parents=True)
    return train(step_dir, {**spec, "config": parse_step_config(spec["config"])})


def large_state(mib: int) -> dict:
    """``mib`` MiB of random float32 in 8 arrays, as a training state (built once, reused)."""
    import jax

    rng = np.random.default_rng(1)
    n = mib * 2**20 // 4 // 8
    state = {"params": {f"w{i}": jax.device_put(rng.standard_normal(n, dtype=np.float32)) for i in range(8)},
             "opt_state": {}}
    return jax.block_until_ready(state)


def large_save_mb_per_s(directory: Path, state: dict) -> tuple[float, float, int]:
    """One synchronous tidal Checkpointer save of ``state`` (default options: tree layout).

    Returns:
        ``(MB/s to files finalised by orbax, MB/s to the verified manifest written, bytes)``;
        the directory is deleted afterwards, like dd's file, so rounds start alike.
    """
    from tidal.train.checkpoints import Checkpointer

    ckpt = Checkpointer(directory, keep=1, async_save=False)
    start = time.perf_counter()
    ckpt.save(1, state)
    manifest = ckpt.wait()
    verified = time.perf_counter() - start
    ckpt.close()
    shutil.rmtree(directory)
    size = manifest["total_bytes"]
    return size / 1e6 / ckpt.save_seconds[0][2], size / 1e6 / verified, size


def dd_mb_per_s(directory: Path, mib: int) -> float:
    target = directory / "dd.tmp"
    start = time.perf_counter()
    proc = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fsync"],
                          capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - start
    target.unlink()
    copied = re.search(r"(\d+) bytes", proc.stderr)
    return (int(copied.group(1)) if copied else mib * 2**20) / 1e6 / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (hand, tidal, tidal+ckpt); best kept")
    parser.add_argument("--large-mib", type=int, default=256, help="size of the large-checkpoint write test")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        inputs = make_inputs(root / "inputs", n_seq=args.steps * args.batch_size)
        spec = {"config": config(args, args.steps), "inputs": inputs, "seed": 1}
        ckpt_spec = {**spec, "config": config(args, args.checkpoint_every)}
        hands, plains, ckpts = [], [], []
        for r in range(args.repeats):  # interleaved rounds; a shared machine slows any of them
            hands.append(hand_loop(spec))
            plains.append(tidal_run(spec, root / f"plain{r}"))
            ckpts.append(tidal_run(ckpt_spec, root / f"ckpt{r}"))
            print(f"round {r}: hand {hands[-1][0]:,.0f} tidal {plains[-1]['loop_tokens_per_second']:,.0f} "
                  f"tidal+ckpt {ckpts[-1]['loop_tokens_per_second']:,.0f} tokens/s; per CPU second: hand "
                  f"{hands[-1][1]:,.0f} tidal {plains[-1]['loop_tokens_per_cpu_second']:,.0f} tidal+ckpt "
                  f"{ckpts[-1]['loop_tokens_per_cpu_second']:,.0f}", flush=True)
        hand_tps = max(h[0] for h in hands)
        hand_cpu = max(h[1] for h in hands)
        plain_cpu = max(p["loop_tokens_per_cpu_second"] for p in plains)
        ckpt_cpu = max(c["loop_tokens_per_cpu_second"] for c in ckpts)
        plain = max(plains, key=lambda s: s["loop_tokens_per_second"])
        with_ckpt = max(ckpts, key=lambda s: s["loop_tokens_per_second"])
        train_ckpt_mb_s = with_ckpt["checkpoint_bytes"] / 1e6 / with_ckpt["checkpoint_write_s_mean"]
        # interleaved like the training rounds, after one warm-up round of each (printed, not counted): a
        # process's first writes of a size fault in fresh memory (its buffers, the page cache),
        # which on a VM can cost more than the write; a training run's saves are not first writes
        state, larges, dds = large_state(args.large_mib), [], []
        for r in range(args.repeats + 1):
            larges.append(large_save_mb_per_s(root / f"large{r}", state))
            dds.append(dd_mb_per_s(root, max(64, int(np.ceil(larges[-1][2] / 2**20)))))
            print(f"write round {r}{' (warm-up)' if r == 0 else ''}: checkpoint {larges[-1][0]:,.0f} MB/s "
                  f"({larges[-1][1]:,.0f} MB/s with its manifest), dd {dds[-1]:,.0f} MB/s", flush=True)
        del state
        large_mb_s, verified_mb_s, large_bytes = max(larges[1:])
        dd = max(dds[1:])
    step_s = plain["step_time_s"]
    round_ratios = [c["loop_tokens_per_second"] / h[0] for c, h in zip(ckpts, hands)]
    print(f"tidal+ckpt: {with_ckpt['checkpoint_saves']} async saves of {with_ckpt['checkpoint_bytes'] / 1e6:.1f} MB, "
          f"one every {args.checkpoint_every} steps = {args.checkpoint_every * step_s:.1f} s of training, "
          f"blocking {with_ckpt['checkpoint_blocking_s_mean'] * 1e3:.1f} ms, written in "
          f"{with_ckpt['checkpoint_write_s_mean'] * 1e3:.0f} ms each ({train_ckpt_mb_s:.1f} MB/s); "
          f"large save {large_bytes / 1e6:.0f} MB at {large_mb_s:.0f} MB/s ({verified_mb_s:.0f} MB/s with its "
          f"manifest); dd {dd:.0f} MB/s; per-round ckpt/hand ratios {', '.join(f'{r:.3f}' for r in round_ratios)}")
    print(f"RESULT hand_tokens_per_s={hand_tps:.0f} tidal_tokens_per_s={plain['loop_tokens_per_second']:.0f} "
          f"tidal_ckpt_tokens_per_s={with_ckpt['loop_tokens_per_second']:.0f} "
          f"ratio_vs_hand_loop={plain['loop_tokens_per_second'] / hand_tps:.3f} "
          f"ratio_with_checkpointing={with_ckpt['loop_tokens_per_second'] / hand_tps:.3f} "
          f"ckpt_mb_per_s={large_mb_s:.1f} train_ckpt_mb_per_s={train_ckpt_mb_s:.1f} dd_mb_per_s={dd:.1f} "
          f"ratio_vs_dd={large_mb_s / dd:.3f} train_ckpt_ratio_vs_dd={train_ckpt_mb_s / dd:.3f} "
          f"cpu_ratio_vs_hand_loop={plain_cpu / hand_cpu:.3f} cpu_ratio_with_checkpointing={ckpt_cpu / hand_cpu:.3f} "
          f"median_round_ratio_with_checkpointing={statistics.median(round_ratios):.3f} "
          f"ckpt_vs_tidal={with_ckpt['loop_tokens_per_second'] / plain['loop_tokens_per_second']:.3f} "
          f"cpu_ckpt_vs_tidal={ckpt_cpu / plain_cpu:.3f} "
          f"checkpoint_every={args.checkpoint_every} checkpoint_interval_s={args.checkpoint_every * step_s:.1f} "
          f"verified_ckpt_ratio_vs_dd={verified_mb_s / dd:.3f}")


if __name__ == "__main__":
    main()
