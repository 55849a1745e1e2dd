"""Step kind ``train``: write the step spec, run the training entrypoint, return its summary.

Light on purpose: importing this module imports no JAX (the step runner reads the constants).
The work happens in a separate process, ``python -m tidal.train STEP_DIR`` (the same command a
Kubernetes pod runs), launched here by :func:`tidal.launch.local.run_entrypoint`.
"""

from __future__ import annotations

import json
from typing import Any

from tidal.context import StepContext
from tidal.launch.local import TrainingFailed, run_entrypoint

STEP_VERSION = 1
RESUMABLE = True
SPEC_NAME = "spec.json"
SUMMARY_NAME = "summary.json"

__all__ = ["RESUMABLE", "STEP_VERSION", "TrainingFailed", "run", "write_spec"]


def write_spec(ctx: StepContext) -> dict[str, Any]:
    """Write ``ctx.out_dir/spec.json`` = ``{step_id, name, kind, config, inputs, input_ids, seed}``.

    ``inputs`` maps input step name -> directory as a string. Returns the spec.
    """
    spec = {"step_id": ctx.step_id, "name": ctx.name, "kind": ctx.kind, "config": ctx.config,
            "inputs": {name: str(path) for name, path in sorted(ctx.inputs.items())},
            "input_ids": dict(sorted(ctx.input_ids.items())), "seed": ctx.seed}
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    tmp = ctx.out_dir / (SPEC_NAME + ".tmp")
    tmp.write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    tmp.replace(ctx.out_dir / SPEC_NAME)
    return spec


def run(ctx: StepContext) -> dict[str, Any]:
    """Train (resuming from ``ctx.out_dir/checkpoints`` if present) in a subprocess.

    Returns:
        ``summary.json``: flat numbers/strings (steps, tokens_seen, final_train_loss,
        eval_loss, eval_loss/<src>, eval_bpb/<src>, param_count, checkpoint_step,
        checkpoint_root_hash, params_sha256, environment_fingerprint, mesh, tokens_per_second,
        mfu, peak_memory_bytes, ...; see :func:`tidal.train.trainer.train`).

    Raises:
        TrainingFailed: the entrypoint exited non-zero; carries ``exit_code`` (2: bad config,
            data or checkpoint shape; 75: preempted by SIGTERM after checkpointing, rerun to
            resume) and ``tail`` (its last ~40 output lines).
    """
    write_spec(ctx)
    run_entrypoint(ctx.out_dir, log=ctx.log)
    return json.loads((ctx.out_dir / SUMMARY_NAME).read_text())
