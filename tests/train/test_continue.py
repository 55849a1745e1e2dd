"""Continuing a committed train step (``train.continue_from``, tidal/train/continuation.py).

A 4-step run continued to 8 steps with the same constant-LR schedule ends bitwise where one
uninterrupted 8-step run ends (every logged loss, the final parameters), even under another step
seed: the batch order is the parent's continued, so no batch is repeated at the seam. ``rewarm``
restarts the warmup with a fresh optimizer state; a checkpoint whose root hash is not the planned
one is refused. Trained in this process (tidal.train.trainer.train), on the tiny model of
test_train_e2e.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from test_train_e2e import CONFIG, build_inputs, final_params, losses, make_ctx

import tidal.train
from tidal.train.config import CONTINUE_INPUT, ConfigError
from tidal.train.trainer import train

SEED = 2**62 + 12345  # make_ctx's step seed
CONSTANT = dict(CONFIG, optimizer={**CONFIG["optimizer"], "min_lr_ratio": 1.0, "warmup_steps": 2},
                steps=8, checkpoint_every=4, eval_every=4, log_every=1, keep_checkpoints=2)


def run(out, inputs, config, seed=SEED):
    ctx = make_ctx(out, inputs, config)
    spec = {**tidal.train.write_spec(ctx), "seed": seed}
    (out / "spec.json").write_text(tidal.train.spec_text(spec))
    return train(out, spec, log=logging.getLogger("test.continue"))


def continued(parent_dir, steps=8, schedule="continue", root_hash=None):
    summary = json.loads((parent_dir / "summary.json").read_text())
    return dict(CONSTANT, steps=steps, continue_from={
        "step": "train-0123456789ab", "checkpoint": "final", "schedule": schedule,
        "checkpoint_step": summary["checkpoint_step"],
        "checkpoint_root_hash": root_hash or summary["checkpoint_root_hash"], "data_seed": SEED})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("continue")
    inputs = build_inputs(root / "inputs")
    run(root / "whole", inputs, CONSTANT)
    run(root / "parent", inputs, dict(CONSTANT, steps=4))
    return root, inputs


def test_continuing_a_constant_schedule_equals_one_run(runs):
    root, inputs = runs
    out = root / "continued"
    # another step seed: the parameters come from the checkpoint, the batch order from data_seed
    summary = run(out, {**inputs, CONTINUE_INPUT: root / "parent"}, continued(root / "parent"), seed=7)
    assert losses(out) == losses(root / "whole")  # the parent's lines 1..4, then 5..8 bitwise equal
    got, want = final_params(out), final_params(root / "whole")
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    parent = json.loads((root / "parent" / "summary.json").read_text())
    assert summary["continue_from"] == "train-0123456789ab"
    assert summary["continue_from_checkpoint_step"] == 4
    assert summary["continue_from_root_hash"] == parent["checkpoint_root_hash"]
    assert summary["steps"] == 8 and summary["checkpoint_step"] == 8
    assert not (root / "parent" / "checkpoints" / "8").exists()  # the parent's directory is only read


def test_rewarm_restarts_the_schedule_with_a_fresh_optimizer(runs):
    root, inputs = runs
    out = root / "rewarm"
    run(out, {**inputs, CONTINUE_INPUT: root / "parent"}, continued(root / "parent", schedule="rewarm"))
    lr = {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    peak = CONSTANT["optimizer"]["lr"]
    assert lr[4] == pytest.approx(peak) and lr[5] == 0.0 and lr[6] == pytest.approx(peak / 2)
    assert lr[7] == pytest.approx(peak)  # warmup 2 over the 4 new updates, then constant
    got, want = final_params(out), final_params(root / "whole")
    assert not all(np.array_equal(got[k], want[k]) for k in want)


def test_a_checkpoint_of_another_content_is_refused(runs):
    root, inputs = runs
    out = root / "wrong-hash"
    with pytest.raises(ConfigError, match="is not the planned"):
        run(out, {**inputs, CONTINUE_INPUT: root / "parent"}, continued(root / "parent", root_hash="0" * 64))
    assert not (out / "checkpoints" / "4").exists()


def test_steps_not_above_the_checkpoint_is_refused():
    from tidal.train.config import parse_step_config

    config = dict(CONSTANT, steps=4, continue_from={"step": "train-0123456789ab", "checkpoint_step": 4,
                                                    "checkpoint_root_hash": "a" * 64, "data_seed": 1})
    with pytest.raises(ConfigError, match=r"continue_from: steps \(4\) must be above the checkpoint's step \(4\)"):
        parse_step_config(config)
