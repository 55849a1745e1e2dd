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


def test_a_branch_puts_its_final_evals_on_the_trunks_eval_curve(tmp_path):
    """The branch's summary evals land in the trunk's eval-curve run as decayed/<metric> at the branch's last
    step, through a real MLflow store; the trunk itself and a committed parent's continuation put none."""
    from mlflow.tracking import MlflowClient

    from tidal.core.branch_curve import branch_curve
    from tidal.tracking import Tracker
    from tidal.tracking.curves import CURVE_TAG

    steps = plan(**{"train.decay_branches": [{"at_step": 200, "steps": 40}, {"at_step": 300, "steps": 40}]})
    summary = {"eval_loss": 3.25, "eval_loss/heldout/brown": 3.5, "eval_bpb/udhr": 1.75, "final_train_loss": 3.0,
               "checkpoint_root_hash": "ab" * 32}
    assert branch_curve(steps, steps["train"], summary) is None
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = Tracker(uri, "tidal-branches", pending_dir=tmp_path / "pending")
    for name, loss in (("train-decay-200-40", 3.25), ("train-decay-300-40", 3.0)):
        trunk_id, rows = branch_curve(steps, steps[name], {**summary, "eval_loss": loss})
        assert trunk_id == steps["train"].step_id
        tracker.log_eval_curve(trunk_id, rows)
    client = MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("tidal-branches").experiment_id],
                               filter_string=f"tags.`{CURVE_TAG}` = '{steps['train'].step_id}'")
    history = {(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "decayed/eval_loss")}
    assert history == {(240, 3.25), (340, 3.0)}
    assert {m.step for m in client.get_metric_history(run.info.run_id, "decayed/eval_bpb/udhr")} == {240, 340}
    assert "decayed/final_train_loss" not in run.data.metrics
    # the branch's downstream eval step: lm-eval's <task>/<metric> beside the trunk's, timings left out
    evals = {"tidal_brown_cloze/acc": 0.3, "eval_seconds/tidal_brown_cloze": 12.0, "checkpoint_root_hash": "ab" * 32}
    assert branch_curve(steps, steps["eval"], evals) is None  # the trunk's own eval: its curve has it already
    trunk_id, rows = branch_curve(steps, steps["eval-train-decay-200-40"], evals)
    assert rows == [{"step": 240, "decayed/tidal_brown_cloze/acc": 0.3}]
