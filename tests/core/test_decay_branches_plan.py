"""Planning ``train.decay_branches`` (Delphi's cooldowns off a WSD trunk): each branch is a train step whose id
follows the trunk's id, its start and its length; adding a branch leaves the trunk's id alone; a branch that
does not start at a permanent checkpoint is one error naming the field."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tidal.config import RecipeError
from tidal.core.planner import build_graph
from tidal.recipe import load_recipe

TINY = REPO / "recipes" / "tiny.yaml"
WSD = {"train.optimizer.schedule": "wsd", "train.optimizer.decay_fraction": 0.2,
       "train.checkpoint_permanent_every": 100}


def plan(**overrides):
    return {s.name: s for s in build_graph(load_recipe(TINY, {**WSD, **overrides}))}


def test_branches_are_steps_of_their_own_and_leave_the_trunk_alone():
    plain = plan()
    branched = plan(**{"train.decay_branches": [{"at_step": 200, "steps": 40}, {"at_fraction": 0.75, "steps": 40}]})
    assert branched["train"].step_id == plain["train"].step_id
    names = sorted(n for n in branched if n.startswith("train-decay"))
    assert names == ["train-decay-200-40", "train-decay-300-40"]  # 0.75 of 400 steps
    branch = branched["train-decay-200-40"]
    assert branch.config["steps"] == 240 and branch.inputs[-1].name == "train"
    ref = branch.config["continue_from"]
    assert ref["step"] == plain["train"].step_id and ref["schedule"] == "decay" and ref["checkpoint_step"] == 200
    other = plan(**{"train.decay_branches": [{"at_step": 200, "steps": 60}]})["train-decay-200-60"]
    assert other.step_id != branch.step_id
    retrunked = plan(**{"train.optimizer.lr": 0.002, "train.decay_branches": [{"at_step": 200, "steps": 40}]})
    assert retrunked["train-decay-200-40"].step_id != branch.step_id  # the trunk's id is in the branch's


@pytest.mark.parametrize("overrides, rule", [
    ({"train.decay_branches": [{"at_step": 150, "steps": 40}]}, "a multiple of checkpoint_permanent_every = 100"),
    ({"train.decay_branches": [{"at_step": 400, "steps": 40}]}, "below steps = 400"),
    ({"train.decay_branches": [{"at_step": 100, "at_fraction": 0.5, "steps": 4}]}, "at_step or at at_fraction"),
    ({"train.optimizer.schedule": "cosine", "train.decay_branches": [{"at_step": 100, "steps": 4}]},
     "set optimizer.schedule: wsd and checkpoint_permanent_every"),
])
def test_a_branch_that_cannot_start_is_one_error_naming_the_field(overrides, rule):
    with pytest.raises(RecipeError, match="train.decay_branches") as err:
        plan(**overrides)
    assert rule in str(err.value)
