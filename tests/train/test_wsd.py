"""The warmup-stable-decay schedule (``optimizer.schedule: wsd``, tidal/train/optimizer.py): its learning
rates at the phase boundaries for each decay shape, its plan-time rules, and that the cosine default
leaves every existing train config (hence step id) unchanged. A decay branch equal, bitwise, to the run
that decays at its checkpoint: tests/train/test_continue.py."""

from __future__ import annotations

import itertools
import math

import pytest
from pydantic import ValidationError

from tidal.train.config import OptimizerConfig, TrainConfig, wsd_decay_steps
from tidal.train.optimizer import make_optimizer, wsd_schedule

LR = 1e-3


def lrs(schedule, n):
    return [float(schedule(i)) for i in range(n)]


@pytest.mark.parametrize("shape, quarter", [("linear", 0.75), ("cosine", (1 + math.cos(math.pi / 4)) / 2),
                                            ("1-sqrt", 0.5)])
def test_warmup_then_stable_then_the_decay_shape_to_the_floor(shape, quarter):
    cfg = OptimizerConfig(lr=LR, warmup_steps=4, min_lr_ratio=0.0, schedule="wsd", decay_shape=shape)
    got = lrs(wsd_schedule(cfg, decay_start=10, decay_steps=8), 20)
    assert got[0] == 0.0 and got[2] == pytest.approx(LR / 2) and got[4] == pytest.approx(LR)
    assert got[4:11] == [pytest.approx(LR)] * 7  # stable through the first decay update (t = 0)
    assert got[12] == pytest.approx(LR * quarter, rel=1e-5)  # t = 1/4 of the decay
    assert got[18] == 0.0 and got[19] == 0.0  # the floor, then held
    assert all(a >= b for a, b in itertools.pairwise(got[10:]))  # never rises while decaying


def test_the_decay_is_the_last_fraction_of_the_steps_and_ends_at_the_floor():
    cfg = OptimizerConfig(lr=LR, warmup_steps=10, min_lr_ratio=0.1, schedule="wsd", decay_fraction=0.2)
    _, schedule = make_optimizer(cfg, 100)
    got = lrs(schedule, 101)
    assert wsd_decay_steps(0.2, 100) == 20
    assert got[79] == pytest.approx(LR) and got[80] == pytest.approx(LR) and got[81] < LR
    assert got[100] == pytest.approx(LR * 0.1)


def test_the_cosine_default_keeps_every_existing_config_and_wsd_is_hashed():
    assert OptimizerConfig().model_dump() == OptimizerConfig(schedule="cosine").model_dump()
    assert {"schedule", "decay_fraction", "decay_shape"}.isdisjoint(OptimizerConfig().model_dump())
    wsd = OptimizerConfig(schedule="wsd").model_dump()
    assert (wsd["schedule"], wsd["decay_fraction"], wsd["decay_shape"]) == ("wsd", 0.2, "linear")


def test_a_decay_longer_than_what_warmup_leaves_is_refused_at_load():
    with pytest.raises(ValidationError, match=r"warmup_steps \(50\) plus the decay .* exceed steps \(100\)"):
        TrainConfig.model_validate({"steps": 100, "optimizer": {"schedule": "wsd", "warmup_steps": 50,
                                                                "decay_fraction": 0.6}})


def test_a_decay_branch_needs_a_wsd_optimizer():
    branch = {"step": "train-0123456789ab", "schedule": "decay"}
    with pytest.raises(ValidationError, match="set optimizer.schedule: wsd"):
        TrainConfig.model_validate({"steps": 100, "continue_from": branch})
    TrainConfig.model_validate({"steps": 100, "continue_from": branch, "optimizer": {"schedule": "wsd"}})
