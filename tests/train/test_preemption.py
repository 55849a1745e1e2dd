"""Preemption proof: a run killed at random steps and resumed each time ends bitwise where an
uninterrupted run ends (every logged loss and the final parameters), and SIGTERM checkpoints
the current step and exits with code 75 (tidal.train.trainer.EXIT_PREEMPTED).

Each run is the real entrypoint, ``python -m tidal.train STEP_DIR``, in its own process.
SIGKILL may land while an asynchronous checkpoint is being written: that checkpoint then has
no manifest and the resume falls back to the previous one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import numpy as np
import pytest
from test_train_e2e import CONFIG, build_inputs, fast_subprocesses, losses, make_ctx  # noqa: F401

import tidal.train
from tidal.launch.local import entrypoint_command, run_entrypoint
from tidal.train.preemption import EXIT_PREEMPTED

STEPS = 24
RUN_CONFIG = dict(CONFIG, steps=STEPS, checkpoint_every=3, eval_every=12, log_every=1, keep_checkpoints=2)
STEP_LINE = re.compile(r"^step (\d+)/")


def run_and_signal(step_dir, at_step: int | None, sig: int) -> tuple[int, list[str]]:
    """Run the entrypoint; send ``sig`` once it reports step ``at_step`` (None: never)."""
    proc = subprocess.Popen(entrypoint_command(step_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines, sent = [], False
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        found = STEP_LINE.match(line)
        if at_step is not None and not sent and found and int(found.group(1)) >= at_step:
            proc.send_signal(sig)
            sent = True
    return proc.wait(timeout=300), lines


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("preempt")
    inputs = build_inputs(root / "inputs")
    ref = make_ctx(root / "reference", inputs, RUN_CONFIG)
    summary = tidal.train.run(ref)
    return root, inputs, losses(ref.out_dir), summary


def test_sigkill_three_times_then_resume_is_bitwise_identical(setup):
    root, inputs, want_losses, want = setup
    ctx = make_ctx(root / "killed", inputs, RUN_CONFIG)
    tidal.train.write_spec(ctx)
    kill_steps = sorted(np.random.default_rng(20261130).choice(np.arange(2, STEPS - 1), 3, replace=False))
    resumed_from = []
    for at in kill_steps:
        code, lines = run_and_signal(ctx.out_dir, int(at), signal.SIGKILL)
        assert code == -signal.SIGKILL, lines[-20:]
        assert not (ctx.out_dir / "summary.json").exists()
        resumed_from += [int(m.group(1)) for line in lines
                         if (m := re.match(r"resumed from checkpoint step (\d+)", line))]
    code, lines = run_and_signal(ctx.out_dir, None, signal.SIGKILL)
    assert code == 0, lines[-20:]
    resumed_from += [int(m.group(1)) for line in lines if (m := re.match(r"resumed from checkpoint step (\d+)", line))]
    assert len(resumed_from) == 3 and all(step % 3 == 0 for step in resumed_from), resumed_from
    assert losses(ctx.out_dir) == want_losses  # every step 1..24 once, bitwise equal
    got = json.loads((ctx.out_dir / "summary.json").read_text())
    assert got["params_sha256"] == want["params_sha256"]
    assert got["eval_loss/udhr"] == want["eval_loss/udhr"] and got["final_train_loss"] == want["final_train_loss"]


def test_sigterm_checkpoints_the_current_step_and_exits_75(setup):
    root, inputs, want_losses, want = setup
    ctx = make_ctx(root / "terminated", inputs, RUN_CONFIG)
    tidal.train.write_spec(ctx)
    code, lines = run_and_signal(ctx.out_dir, 7, signal.SIGTERM)
    assert code == EXIT_PREEMPTED, lines[-20:]
    saved = [int(m.group(1)) for line in lines if (m := re.search(r"SIGTERM: checkpoint of step (\d+) saved", line))]
    assert len(saved) == 1 and saved[0] >= 7, lines[-20:]
    stopped = saved[0]
    manifest = json.loads((ctx.out_dir / "checkpoint_manifest.json").read_text())
    assert manifest["step"] == stopped  # written and verified before the exit, not left in flight
    assert losses(ctx.out_dir)[-1][0] == stopped
    code, lines = run_and_signal(ctx.out_dir, None, signal.SIGTERM)
    assert code == 0, lines[-20:]
    assert f"resumed from checkpoint step {stopped} ({ctx.out_dir / 'checkpoints' / str(stopped)})" in lines
    assert losses(ctx.out_dir) == want_losses
    assert json.loads((ctx.out_dir / "summary.json").read_text())["params_sha256"] == want["params_sha256"]


@pytest.mark.parametrize("stop", [12, 13])  # 96 sequences / 8 a batch: step 12 ends epoch 0 exactly
def test_a_resume_at_an_epoch_boundary_and_one_step_after_reads_the_same_batches(setup, stop):
    """A run of 30 steps (2.5 epochs) stopped at the end of the first epoch, or one step into the
    second, and resumed: every loss and the final parameters are the uninterrupted run's, so the
    resumed run read the uninterrupted run's batches (each epoch's permutation, from its first step)."""
    root, inputs, _, _ = setup
    config = dict(RUN_CONFIG, steps=30, checkpoint_every=1, eval_every=30)
    ref = make_ctx(root / f"epochs-ref-{stop}", inputs, config)
    tidal.train.write_spec(ref)
    assert run_and_signal(ref.out_dir, None, signal.SIGTERM)[0] == 0
    ctx = make_ctx(root / f"epochs-{stop}", inputs, config)
    tidal.train.write_spec(ctx)
    run_entrypoint(ctx.out_dir, extra_args=["--stop-after", str(stop)])
    code, lines = run_and_signal(ctx.out_dir, None, signal.SIGTERM)
    assert code == 0 and f"resumed from checkpoint step {stop} ({ctx.out_dir / 'checkpoints' / str(stop)})" in lines
    assert losses(ctx.out_dir) == losses(ref.out_dir)
    got, want = (json.loads((d / "summary.json").read_text()) for d in (ctx.out_dir, ref.out_dir))
    assert got["params_sha256"] == want["params_sha256"]
