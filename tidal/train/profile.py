"""Profiling mode (``python -m tidal.train STEP_DIR --profile N``): time N steps, commit nothing."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tidal.integrity.fingerprint import environment_fingerprint
from tidal.storage.layout import SPEC_JSON as SPEC
from tidal.storage.layout import atomic_write_text
from tidal.train import distributed
from tidal.train import mesh as meshlib
from tidal.train.build import build
from tidal.train.config import ConfigError
from tidal.train.distributed import host_scalar
from tidal.train.metrics import device_memory
from tidal.train.model import flops_per_token, param_count

PROFILE = "profile.json"


def profile(step_dir: str | Path, spec: dict[str, Any], n_steps: int) -> dict[str, Any]:
    """Run ``n_steps`` steps from the initial state and record their speed; commit nothing.

    No checkpoint is read or written and no ``metrics.jsonl``/``summary.json`` is touched;
    only ``profile.json`` (process 0) is written, so the step stays uncommitted.

    Returns:
        ``{"steps", "compile_and_first_step_s", "step_time_s" (mean of steps 2..N, each
        timed to completion), "step_time_s_median", "tokens_per_second", "mfu" (or None),
        "peak_memory_bytes", "memory_source", "mesh", "device_kind", "devices",
        "param_count", "flops_per_token", "environment_fingerprint"}``.

    Raises:
        ConfigError: ``n_steps < 2`` (one step only measures compilation), or a bad config.
    """
    if n_steps < 2:
        raise ConfigError(f"--profile needs at least 2 steps (the first one compiles), got {n_steps}")
    run = build(spec, where=Path(step_dir) / SPEC)
    state = run.fresh_state()
    times = []
    for i in range(n_steps):
        batch = run.batch(i)
        start = time.perf_counter()
        state, stats = run.step(state, batch, np.int32(i))
        jax.block_until_ready((state, stats))
        times.append(time.perf_counter() - start)
    memory = device_memory()
    mean = statistics.fmean(times[1:])
    out = {"steps": n_steps, "compile_and_first_step_s": times[0], "step_time_s": mean,
           "step_time_s_median": statistics.median(times[1:]), "tokens_per_second": run.tokens_per_step / mean,
           "mfu": run.mfu(run.tokens_per_step / mean), "peak_memory_bytes": memory["peak_memory_bytes"],
           "memory_source": memory["memory_source"], "mesh": meshlib.describe(run.mesh).split(" (")[0],
           "device_kind": jax.devices()[0].device_kind, "devices": jax.device_count(),
           "param_count": param_count(run.model_cfg),
           "flops_per_token": flops_per_token(run.model_cfg, run.context),
           "final_loss": host_scalar(stats["loss"]), "environment_fingerprint": environment_fingerprint()}
    if distributed.is_primary():
        path = Path(step_dir) / PROFILE
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out
