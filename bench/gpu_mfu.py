"""Benchmark: MFU and tokens/s of tidal's ~1B preset, bf16 compute, on one GPU (synthetic tokens).

    python bench/gpu_mfu.py [--preset 1b] [--batch 16] [--seq-len 2048] [--steps 20] [--warmup 3]
    python bench/gpu_mfu.py --smoke        # tiny preset, 3 steps, any backend (CPU included)

Usually started by ``bench/gpu_mfu.sh``, which prepares the Python environment. Trains
:class:`tidal.train.model.Transformer` (the trainer's model, same loss) with float32 master
parameters, ``compute_dtype: bfloat16`` activations and AdamW with global-norm clipping (the
trainer's optimizer), on random token ids drawn on the device (no downloads, no input
pipeline). The first ``--warmup`` steps (compilation, autotuning) are not timed; then
``--steps`` steps run back to back and are timed once, after ``block_until_ready``.

MFU = tokens/s x :func:`tidal.train.flops.flops_per_token` (6N + 12·L·d·T, PaLM Appendix B)
/ the device's peak dense bf16 FLOP/s (:data:`tidal.train.flops.PEAK_BF16_FLOPS`, from the
vendor datasheet; 989.5 TFLOP/s for an H200 SXM). Prints the planned memory
(:mod:`tidal.train.memory`) next to the measured peak, then one line::

    RESULT mfu=… tokens_per_s=… step_s=… params=… flops_per_token=… peak_gib=… planned_gib=…

``mfu=nan`` where the device has no peak in the table (CPUs).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--smoke`` switches every default to a CPU-sized run)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny preset, batch 2, 64 tokens, 3 steps")
    parser.add_argument("--preset", default=None, help="model preset (default 1b; tiny with --smoke)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 32000; 512 smoke)")
    parser.add_argument("--batch", type=int, default=None, help="sequences per step (default 16; 2 smoke)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 2048; 64 smoke)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20; 3 smoke)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 3; 1 smoke)")
    parser.add_argument("--attention", choices=["auto", "einsum", "xla", "cudnn"], default="auto",
                        help="auto: cudnn flash attention on GPU, xla elsewhere")
    parser.add_argument("--remat", action="store_true", help="recompute block activations in the backward pass")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="compute dtype")
    args = parser.parse_args(argv)
    smoke = {"preset": "tiny", "vocab": 512, "batch": 2, "seq_len": 64, "steps": 3, "warmup": 1}
    full = {"preset": "1b", "vocab": 32_000, "batch": 16, "seq_len": 2048, "steps": 20, "warmup": 3}
    defaults = smoke if args.smoke else full
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the benchmark; returns the RESULT figures (also printed)."""
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp
    import optax

    from tidal.train.flops import (
        ModelConfig,
        UnknownDeviceKind,
        flops_per_token,
        mfu,
        param_count,
        peak_flops_per_s,
    )
    from tidal.train.memory import GIB, MeshShape, plan_memory
    from tidal.train.model import init_params, next_token_loss

    device = jax.devices()[0]
    attention = args.attention
    if attention == "auto":
        attention = "cudnn" if device.platform == "gpu" and args.dtype == "bfloat16" else "xla"
    cfg = ModelConfig(preset=args.preset, compute_dtype=args.dtype).shape(args.vocab, attention=attention,
                                                                          remat=args.remat)
    n_params, fpt = param_count(cfg), flops_per_token(cfg, args.seq_len)
    tokens_per_step = args.batch * args.seq_len
    print(f"jax {jax.__version__} on {len(jax.devices())} x {device.device_kind} ({device.platform}); "
          f"preset {args.preset}: {n_params:,} params, {fpt / 1e9:.2f} GFLOP/token; batch {args.batch} x "
          f"{args.seq_len} tokens, {args.dtype} compute, attention {attention}, remat {args.remat}", flush=True)
    stats = device.memory_stats() or {}
    capacity = stats.get("bytes_limit", 0)
    plan = plan_memory(cfg, batch_size=args.batch, seq_len=args.seq_len, mesh=MeshShape(),
                       capacity_bytes=capacity or 1, device=device.device_kind)
    print(f"memory plan: {plan.describe()}", flush=True)

    # the trainer's optimizer (tidal.train.optimizer.make_optimizer): clip 1.0, AdamW, no decay on norms
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-4, 10, 10_000, 3e-5)
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1, mask=decay_mask))

    @jax.jit
    def init(key):
        params = init_params(cfg, key, args.seq_len)
        return {"params": params, "opt_state": tx.init(params)}

    @jax.jit
    def batches(key):  # a few distinct synthetic batches, made on the device
        return jax.random.randint(key, (4, args.batch, args.seq_len + 1), 0, args.vocab, dtype=jnp.int32)

    def step(state, batch):
        loss, grads = jax.value_and_grad(lambda p: next_token_loss(p, cfg, batch))(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    train_step = jax.jit(step, donate_argnums=0)
    state = init(jax.random.key(0))
    data = batches(jax.random.key(1))
    started = time.perf_counter()
    for i in range(args.warmup):
        state, loss = train_step(state, data[i % 4])
    first_loss = float(loss)
    print(f"warm-up: {args.warmup} steps (compile included) {time.perf_counter() - started:.1f} s, "
          f"loss {first_loss:.3f}", flush=True)
    jax.block_until_ready(state)
    started = time.perf_counter()
    for i in range(args.steps):
        state, loss = train_step(state, data[i % 4])
    jax.block_until_ready((state, loss))
    step_s = (time.perf_counter() - started) / args.steps
    tokens_per_s = tokens_per_step / step_s
    try:
        utilisation = mfu(tokens_per_s, cfg, args.seq_len, peak_flops_per_s(device.device_kind))
    except UnknownDeviceKind:
        utilisation = math.nan
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use", 0)
    final_loss = float(loss)
    if not math.isfinite(final_loss):
        raise SystemExit(f"loss is not finite after {args.warmup + args.steps} steps: {final_loss}")
    print(f"timed: {args.steps} steps, {step_s * 1e3:.1f} ms/step, loss {final_loss:.3f}", flush=True)
    result = {"mfu": utilisation, "tokens_per_s": tokens_per_s, "step_s": step_s, "params": n_params,
              "flops_per_token": fpt, "peak_gib": peak / GIB, "planned_gib": plan.total_bytes / GIB}
    print("RESULT " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()),
          flush=True)
    return result


if __name__ == "__main__":
    main()
