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
from tidal.storage.layout import SPEC_JSON as SPEC_NAME
from tidal.storage.layout import SUMMARY_JSON as SUMMARY_NAME
from tidal.storage.layout import atomic_write_text
from tidal.train.config import TrainStepConfig

STEP_VERSION = 3  # 3: loss_curve.png in the step's output (tidal/train/curves.py)
RESUMABLE = True
CHECKPOINT_MANIFEST = "checkpoint_manifest.json"  # tidal.train.checkpoints.LATEST_MANIFEST (no JAX import here)

__all__ = ["RESUMABLE", "STEP_VERSION", "TrainingFailed", "expected_outputs", "run", "write_spec"]


def spec_of(ctx: StepContext) -> dict[str, Any]:
    """The step spec ``{step_id, name, kind, config, inputs, input_ids, seed}``; ``inputs`` maps
    input step name -> its location as a string (a bucket URI on an object-store root, read in place);
    ``config`` is the step's :class:`tidal.train.config.TrainStepConfig` as planned, unchanged
    (:func:`spec_text` serializes it once, :func:`tidal.train.trainer.load_spec` parses it once)."""
    return {"step_id": ctx.step_id, "name": ctx.name, "kind": ctx.kind, "config": ctx.config,
            "inputs": {name: str(path) for name, path in sorted(ctx.inputs.items())},
            "input_ids": dict(sorted(ctx.input_ids.items())), "seed": ctx.seed}


def spec_text(spec: dict[str, Any]) -> str:
    """The exact text of ``spec.json`` (sorted keys: the same spec gives the same bytes): the config
    model's one serialized form, its JSON data, under ``config``."""
    return json.dumps({**spec, "config": spec["config"].model_dump(mode="json")}, indent=1, sort_keys=True) + "\n"


def write_spec(ctx: StepContext) -> dict[str, Any]:
    """Write ``ctx.out_dir/spec.json`` (:func:`spec_of`); returns the spec."""
    spec = spec_of(ctx)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(ctx.out_dir / SPEC_NAME, spec_text(spec))
    return spec


def expected_outputs(config: TrainStepConfig) -> list[str]:
    """The files every finished training run writes, whichever launcher ran it (part of the kind's
    commit contract, :func:`tidal.core.commit.check_outputs`): ``spec.json`` (what ran) and
    ``summary.json`` (what it returned; written after the last checkpoint is final)."""
    return [SPEC_NAME, SUMMARY_NAME]


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
