"""TIDAL_TRAIN_PROFILE_STEPS: a jax.profiler trace of the chosen steps lands in profile_trace/ of the
step (and so in its MLflow artifacts); a malformed value is one error line, exit 2, before training."""

from __future__ import annotations

import os
import subprocess

import pytest
from test_train_e2e import CONFIG, build_inputs, make_ctx

import tidal.train
from tidal.launch.local import entrypoint_command
from tidal.train.trace import parse_steps


def train_with(tmp_path, steps: int, profile_steps: str):
    """The entrypoint on a fresh step of ``steps`` steps with TIDAL_TRAIN_PROFILE_STEPS=``profile_steps``."""
    inputs = build_inputs(tmp_path / "inputs")
    ctx = make_ctx(tmp_path / "run", inputs, dict(CONFIG, steps=steps, checkpoint_every=4, eval_every=steps))
    tidal.train.write_spec(ctx)
    proc = subprocess.run(entrypoint_command(ctx.out_dir), capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "TIDAL_TRAIN_PROFILE_STEPS": profile_steps})
    return ctx, proc


def test_the_chosen_steps_are_traced_into_the_step(tmp_path):
    ctx, proc = train_with(tmp_path, 8, "3:4")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "profiler trace of steps 3..4 in" in proc.stdout
    traces = list((ctx.out_dir / "profile_trace").rglob("*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 1000


def test_a_bad_value_is_refused_before_training(tmp_path):
    _, proc = train_with(tmp_path, 4, "5:2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tidal.train: error:")]
    assert len(errors) == 1 and "TIDAL_TRAIN_PROFILE_STEPS='5:2'" in errors[0]
    assert parse_steps("7") == (7, 7) and parse_steps(None) is None
    for bad in ("0:3", "a:b", "3:"):
        with pytest.raises(ValueError, match="FIRST:LAST"):
            parse_steps(bad)
