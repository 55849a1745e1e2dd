"""Continuing a committed train step (``train.continue_from``, tidal/train/continuation.py).

A 4-step run continued to 8 steps with the same constant-LR schedule ends bitwise where one
uninterrupted 8-step run ends (every logged loss, the final parameters), even under another recipe
seed: the batch order is the parent's continued, so no batch is repeated at the seam. The parent
and the continued step go through the real runner (tidal.core.runner.run_step: inputs, seeds,
spec, subprocess, commit) on a local root, the continuation resolved as the planner resolves it
(tidal.core.continuation). ``rewarm`` restarts the warmup with a fresh optimizer state; a
checkpoint whose root hash is not the planned one is refused. The tiny model of test_train_e2e.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from test_train_e2e import CONFIG, committed_inputs, fast_subprocesses, final_params, losses, make_ctx  # noqa: F401

import tidal.train
from tidal.core.continuation import resolve_continuation
from tidal.core.runner import run_step
from tidal.steps import Step, derive_seed
from tidal.train.config import CONTINUE_INPUT, ConfigError, TrainConfig
from tidal.train.trainer import train

RECIPE_SEED = 3
CONSTANT = dict(CONFIG, optimizer={**CONFIG["optimizer"], "min_lr_ratio": 1.0, "warmup_steps": 2},
                steps=8, checkpoint_every=4, eval_every=4, log_every=1, keep_checkpoints=2)
INPUT_NAMES = ("train_data", "eval_data", "tokenizer")


def train_fields(**changes) -> TrainConfig:
    """The recipe's ``train`` section (what the planner dumps into the step config)."""
    return TrainConfig.model_validate({k: v for k, v in CONSTANT.items() if k not in INPUT_NAMES} | changes)


def train_step(inputs: tuple[Step, ...], fields: TrainConfig, seed: int, resolved=None, parent=None) -> Step:
    config = {"seed": seed, **fields.model_dump(), **({"continue_from": resolved} if resolved else {}),
              **{k: CONSTANT[k] for k in INPUT_NAMES}}
    return Step("train", "train", config, inputs=(*inputs, *((parent,) if parent else ())))


def run(out, inputs, config, seed):
    """Train in this process into ``out`` (no commit)."""
    ctx = make_ctx(out, inputs, config)
    spec = {**tidal.train.write_spec(ctx), "seed": seed}
    (out / "spec.json").write_text(tidal.train.spec_text(spec))
    return train(out, spec, log=logging.getLogger("test.continue"))


def continued(parent_dir, steps=8, schedule="continue", root_hash=None):
    summary = json.loads((parent_dir / "summary.json").read_text())
    return dict(CONSTANT, steps=steps, continue_from={
        "step": "train-0123456789ab", "checkpoint": "final", "schedule": schedule,
        "checkpoint_step": summary["checkpoint_step"],
        "checkpoint_root_hash": root_hash or summary["checkpoint_root_hash"],
        "data_seed": derive_seed(RECIPE_SEED, "train")})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Committed input steps (sealed by hand), the 4-step parent committed by the runner, and one
    uninterrupted 8-step run under the parent's step seed (in this process)."""
    root = tmp_path_factory.mktemp("continue")
    storage, inputs = committed_inputs(root)
    parent = train_step(inputs, train_fields(steps=4), RECIPE_SEED)
    run_step(parent, storage)
    located = {step.name: storage.step_dir(step.step_id) for step in inputs}
    run(root / "whole", located, CONSTANT, derive_seed(RECIPE_SEED, "train"))
    return root, storage, inputs, parent, located


def test_continuing_a_constant_schedule_equals_one_run(runs):
    root, storage, inputs, parent, _ = runs
    fields = train_fields(steps=8, continue_from={"step": parent.step_id})
    ref, resolved = resolve_continuation(fields, storage, "test.yaml")
    # another recipe seed: the parameters come from the checkpoint, the batch order from the parent's seed
    step = train_step(inputs, fields, 7, resolved, ref)
    result = run_step(step, storage)
    out = storage.step_dir(step.step_id)
    assert result.status == "run" and storage.is_committed(step.step_id)
    assert losses(out) == losses(root / "whole")  # the parent's lines 1..4, then 5..8 bitwise equal
    got, want = final_params(out), final_params(root / "whole")
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    parent_summary = json.loads(storage.read_text(parent.step_id, "summary.json"))
    record = json.loads(storage.read_text(step.step_id, "step.json"))
    assert record["hash_input"]["inputs"][CONTINUE_INPUT] == parent.step_id
    assert record["hash_input"]["config"]["continue_from"]["checkpoint_root_hash"] == \
        parent_summary["checkpoint_root_hash"]
    summary = record["summary"]
    assert summary["continue_from"] == parent.step_id and summary["continue_from_checkpoint_step"] == 4
    assert summary["continue_from_root_hash"] == parent_summary["checkpoint_root_hash"]
    assert summary["steps"] == 8 and summary["checkpoint_step"] == 8
    assert not (storage.step_dir(parent.step_id) / "checkpoints" / "8").exists()  # the parent is only read


def test_rewarm_restarts_the_schedule_with_a_fresh_optimizer(runs):
    root, storage, _, parent, located = runs
    out, parent_dir = root / "rewarm", storage.step_dir(parent.step_id)
    run(out, {**located, CONTINUE_INPUT: parent_dir}, continued(parent_dir, schedule="rewarm"), seed=7)
    lines = list(map(json.loads, (out / "metrics.jsonl").read_text().splitlines()))
    lr = {r["step"]: r["lr"] for r in lines if "lr" in r}  # the step-0 line holds evals only
    assert lines[0]["step"] == 0 and "lr" not in lines[0]  # the parent's initial evaluation, its curve's start
    peak = CONSTANT["optimizer"]["lr"]
    assert lr[4] == pytest.approx(peak) and lr[5] == 0.0 and lr[6] == pytest.approx(peak / 2)
    assert lr[7] == pytest.approx(peak)  # warmup 2 over the 4 new updates, then constant
    got, want = final_params(out), final_params(root / "whole")
    assert not all(np.array_equal(got[k], want[k]) for k in want)


def test_a_checkpoint_of_another_content_is_refused(runs):
    root, storage, _, parent, located = runs
    out, parent_dir = root / "wrong-hash", storage.step_dir(parent.step_id)
    with pytest.raises(ConfigError, match="is not the planned"):
        run(out, {**located, CONTINUE_INPUT: parent_dir}, continued(parent_dir, root_hash="0" * 64), seed=7)
    assert not (out / "checkpoints" / "4").exists()


def test_steps_not_above_the_checkpoint_is_refused():
    from tidal.train.config import parse_step_config

    config = dict(CONSTANT, steps=4, continue_from={"step": "train-0123456789ab", "checkpoint_step": 4,
                                                    "checkpoint_root_hash": "a" * 64, "data_seed": 1})
    with pytest.raises(ConfigError, match=r"continue_from: steps \(4\) must be above the checkpoint's step \(4\)"):
        parse_step_config(config)


WSD = {**CONSTANT["optimizer"], "schedule": "wsd", "min_lr_ratio": 0.0, "decay_shape": "1-sqrt"}


def branch_and_straight(storage, inputs, located, straight):
    """An 8-step WSD trunk and its decay branch at checkpoint 4 (2 steps) through the runner, and a straight
    6-step WSD run decaying over its last 2 steps trained into ``straight``: ``(trunk, branch, straight)``
    (bench/train_schedule.py measures the same)."""
    trunk = train_step(inputs, train_fields(steps=8, optimizer={**WSD, "decay_fraction": 0.25}), RECIPE_SEED)
    run_step(trunk, storage)
    fields = train_fields(steps=6, optimizer=WSD, continue_from={"step": trunk.step_id, "checkpoint": 4,
                                                                  "schedule": "decay"})
    ref, resolved = resolve_continuation(fields, storage, "test.yaml")
    branch = train_step(inputs, fields, 7, resolved, ref)
    run_step(branch, storage)
    run(straight, located, dict(CONSTANT, steps=6, optimizer={**WSD, "decay_fraction": 1 / 3}),
        derive_seed(RECIPE_SEED, "train"))
    return trunk, branch, straight


def test_a_decay_branch_of_a_wsd_trunk_is_bitwise_the_run_that_decays_there(runs, tmp_path):
    """An 8-step WSD trunk (decay over its last 2 steps) branched at its stable checkpoint 4 into a 2-step
    decay ends bitwise where a straight 6-step WSD run that decays over its last 2 steps ends."""
    _, storage, inputs, _, located = runs
    trunk, branch, straight = branch_and_straight(storage, inputs, located, tmp_path / "straight")
    assert branch.step_id != trunk.step_id and storage.is_committed(branch.step_id)
    out = storage.step_dir(branch.step_id)
    lr = {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "lr" in r}
    peak = pytest.approx(CONSTANT["optimizer"]["lr"], rel=1e-6)
    assert lr[4] == peak and lr[5] == peak and lr[6] < lr[5]  # line s: update s - 1; updates 4, 5 decay (t = 0, 1/2)
    assert losses(out) == losses(straight)
    got, want = final_params(out), final_params(straight)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    # the same branch planned beside its trunk (train.decay_branches): the trunk read as an input of the graph
    from types import SimpleNamespace

    from tidal.core.plans import decay_branches

    recipe = SimpleNamespace(train=SimpleNamespace(branch_points=lambda: [(4, 2)]))
    [in_graph] = decay_branches(recipe, trunk, trunk.config, inputs)
    assert in_graph.name == "train-decay-4-2" and in_graph.config["continue_from"]["input"] == "train"
    run_step(in_graph, storage)
    out = storage.step_dir(in_graph.step_id)
    assert losses(out) == losses(straight)
    got = final_params(out)
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
