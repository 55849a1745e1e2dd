"""The divergence guard (tidal/train/divergence.py) on a real run: with a high learning rate the tiny
model's loss rises at step 5 above 1.2x the median of the steps before (4.19, 4.19, 4.00, 4.71 ->
5.28 on this machine; deterministic on CPU). ``fail`` stops there naming the step and its batch,
``skip`` drops that update (parameters of steps 4 and 5 equal; the model then stays above the
ceiling and every later update is dropped as well) and resumes bitwise,
``rerun`` restores the checkpoint of step 4, sees the spike repeat and blames the data or the model.
The guard's rules on their own: non-finite values, a rerun that comes back clean, the saved history.
"""

from __future__ import annotations

import json
import math
import subprocess

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from test_train_e2e import CONFIG, build_inputs, make_ctx

import tidal.train
from tidal.launch.local import entrypoint_command
from tidal.train.config import DivergenceConfig, TrainConfig
from tidal.train.divergence import Diverged, Guard, Rerun
from tidal.train.packing import PACKED_KEY, split_packed

SPIKE = 5
OPTIMIZER = dict(CONFIG["optimizer"], lr=0.9, warmup_steps=8, grad_clip=100.0)
RUN_CONFIG = dict(CONFIG, steps=12, checkpoint_every=1, keep_checkpoints=20, eval_every=12, log_every=1,
                  optimizer=OPTIMIZER)


def guarded(action: str) -> dict:
    return dict(RUN_CONFIG, divergence={"action": action, "spike_factor": 1.2, "window": 10, "min_history": 4})


def train(step_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(entrypoint_command(step_dir, args), capture_output=True, text=True, timeout=600,
                          check=False)


def params_at(step_dir, step: int) -> str:
    """sha256-free fingerprint of checkpoint ``step``'s parameters: their bytes, concatenated."""
    with ocp.CheckpointManager(step_dir / "checkpoints") as manager:
        tree = manager.restore(step, args=ocp.args.StandardRestore())
        leaves = (manager.item_metadata(step).custom_metadata or {}).get(PACKED_KEY)
    if leaves is not None:
        arrays = split_packed(tree["packed"], leaves)
        return b"".join(np.ascontiguousarray(v).tobytes() for k, v in sorted(arrays.items()) if k.startswith("params"))
    return b"".join(np.asarray(v).tobytes() for _, v in jax.tree_util.tree_leaves_with_path(tree["params"]))


def events(step_dir) -> list[dict]:
    path = step_dir / "divergence.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return build_inputs(tmp_path_factory.mktemp("div-inputs"))


def test_fail_stops_at_the_spike_naming_the_step_and_its_batch(tmp_path, inputs):
    ctx = make_ctx(tmp_path / "fail", inputs, guarded("fail"))
    tidal.train.write_spec(ctx)
    proc = train(ctx.out_dir)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("tidal.train: error:")]
    assert len(error) == 1 and f"divergence at step {SPIKE}: spike" in error[0], proc.stderr[-2000:]
    (event,) = events(ctx.out_dir)
    assert event["step"] == SPIKE and event["verdict"] == "training stopped" and event["loss"] > event["ceiling"]
    assert event["batch_size"] == 8 and all(b.startswith("tokens-") and ":" in b for b in event["batch"])
    assert not (ctx.out_dir / "checkpoints" / str(SPIKE)).exists()  # the diverged state was never saved
    assert (ctx.out_dir / "checkpoints" / str(SPIKE - 1)).is_dir()


def test_skip_drops_that_update_and_resumes_bitwise(tmp_path, inputs):
    ctx = make_ctx(tmp_path / "skip", inputs, guarded("skip"))
    tidal.train.write_spec(ctx)
    proc = train(ctx.out_dir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    skipped = [e["step"] for e in events(ctx.out_dir)]
    assert SPIKE in skipped and all(e["verdict"] == "update skipped" for e in events(ctx.out_dir))
    assert params_at(ctx.out_dir, SPIKE) == params_at(ctx.out_dir, SPIKE - 1)  # the update was not applied
    assert params_at(ctx.out_dir, SPIKE - 1) != params_at(ctx.out_dir, SPIKE - 2)  # an accepted one was
    for step in skipped:  # here the model stays stuck above the ceiling: every later update is dropped too
        assert params_at(ctx.out_dir, step) == params_at(ctx.out_dir, SPIKE - 1)
    summary = json.loads((ctx.out_dir / "summary.json").read_text())
    assert summary["updates_skipped"] == len(skipped)
    # stopped after the spike and resumed: the guard's history comes back with the checkpoint
    again = make_ctx(tmp_path / "skip-resumed", inputs, guarded("skip"))
    tidal.train.write_spec(again)
    assert train(again.out_dir, "--stop-after", str(SPIKE + 2)).returncode == 0
    assert train(again.out_dir).returncode == 0
    resumed = json.loads((again.out_dir / "summary.json").read_text())
    assert resumed["params_sha256"] == summary["params_sha256"]
    assert [e["step"] for e in events(again.out_dir)] == skipped


def test_rerun_restores_the_checkpoint_and_blames_the_data_when_the_spike_repeats(tmp_path, inputs):
    ctx = make_ctx(tmp_path / "rerun", inputs, guarded("rerun"))
    tidal.train.write_spec(ctx)
    proc = train(ctx.out_dir)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"rerunning from checkpoint step {SPIKE - 1} after a divergence" in proc.stdout
    first, second = events(ctx.out_dir)
    assert (first["step"], first["verdict"]) == (SPIKE, "rerun from the last checkpoint")
    assert second["step"] == SPIKE and "the data or the model" in second["verdict"]
    assert second["loss"] == first["loss"]  # deterministic: the very same loss again
    assert "the data or the model" in proc.stderr


def test_the_rules_on_their_own():
    ids = lambda step: [f"tokens-00000.npy:{step}"]
    guard = Guard(DivergenceConfig(action="fail", min_history=2, spike_factor=2.0), ids)
    assert guard.ceiling == math.inf  # nothing judged before min_history accepted losses
    guard.check(1, 4.0, 1.0)
    guard.check(2, 3.0, 1.0)
    assert guard.ceiling == 7.0  # 2 x median(4, 3)
    with pytest.raises(Diverged, match="step 3: non_finite"):
        guard.check(3, 3.0, float("nan"))  # a finite loss with a NaN gradient norm
    rerun = Guard(DivergenceConfig(action="rerun", min_history=2, spike_factor=2.0, max_reruns=1), ids)
    rerun.restore(guard.state())
    with pytest.raises(Rerun):
        rerun.check(3, float("inf"), 1.0)
    rerun.check(3, 3.5, 1.0)  # after the rerun the step is fine: not the data
    assert rerun.events[-1]["verdict"].startswith("did not repeat") and "hardware" in rerun.events[-1]["verdict"]
    with pytest.raises(Diverged, match="reruns used up"):
        rerun.check(4, 100.0, 1.0)
    assert "divergence" not in TrainConfig().model_dump()  # unset: existing step ids do not change
