"""Issue 23, item 6: every permanent checkpoint of a train step is evaluated by an eval step of its own,
and the results land in one MLflow run per train step, one point per checkpoint step.

Real runner, real lm-eval, real MLflow (a SQLite store); the pipeline is the few attributes
:func:`tidal.core.checkpoint_evals.evaluate_checkpoints` reads, over the committed train step of
tests/eval/conftest.py (8 updates, permanent checkpoints at 4 and 8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.eval.conftest import SEQ_LEN
from tidal.core.checkpoint_evals import checkpoint_eval_steps, curve_points, evaluate_checkpoints
from tidal.core.planner import eval_step
from tidal.eval.config import DownstreamSettings, EvalStepConfig
from tidal.eval.step import RESULTS_JSON
from tidal.settings import current
from tidal.steps import StepGraph
from tidal.tracking import Tracker, mlflow_client

TASK = "tidal_brown_lastword"


@dataclass
class _Recipe:
    name: str


@dataclass
class _Pipeline:
    graph: StepGraph
    storage: object
    uri: str
    recipe: _Recipe

    def step_settings(self):
        return current()

    def tracker(self):
        return Tracker(self.uri, experiment="tidal-ckpt-evals")


@pytest.fixture(scope="module")
def evaluated(committed_train, tmp_path_factory):
    storage, train, tokenizer = committed_train
    final = eval_step(DownstreamSettings(tasks=[TASK], batch_size=4), train, tokenizer, SEQ_LEN)
    graph = StepGraph((*train.inputs, train, final))
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    pipe = _Pipeline(graph, storage, uri, _Recipe("ckpt"))
    return pipe, final, evaluate_checkpoints(pipe), evaluate_checkpoints(pipe)


def test_each_permanent_checkpoint_gets_its_own_eval_step_and_the_final_one_keeps_the_recipes(evaluated):
    pipe, final, first, _ = evaluated
    steps = checkpoint_eval_steps(pipe.graph, pipe.storage)
    assert [s.config.get("checkpoint_step") for s in steps] == [4, None]
    assert steps[1] is final and steps[0].name == "eval-ckpt-4" and steps[0].inputs == final.inputs
    assert "checkpoint_step" not in EvalStepConfig.model_validate(final.config).model_dump()  # ids kept
    assert first["evaluated"] == [s.step_id for s in steps] and first["skipped"] == []
    results = [json.loads(pipe.storage.read_text(s.step_id, RESULTS_JSON)) for s in steps]
    assert [r["checkpoint_step"] for r in results] == [4, 8]
    assert results[0]["checkpoint_root_hash"] != results[1]["checkpoint_root_hash"]
    train_summary = json.loads(pipe.storage.read_text(first["train"], "summary.json"))
    assert results[1]["checkpoint_root_hash"] == train_summary["checkpoint_root_hash"]


def test_the_curve_run_holds_one_point_per_checkpoint_step_and_a_rerun_adds_none(evaluated):
    pipe, _, first, second = evaluated
    assert second["evaluated"] == [] and second["skipped"] == first["evaluated"]
    assert first["points"] == second["points"] == [4, 8]
    assert first["curve_run"] is not None and second["curve_run"] == first["curve_run"]
    client = mlflow_client(pipe.uri)
    run = client.get_run(first["curve_run"])
    assert run.info.status == "FINISHED" and run.data.tags["tidal.eval_curve"] == first["train"]
    rows = curve_points(checkpoint_eval_steps(pipe.graph, pipe.storage), pipe.storage)
    key = f"{TASK}/perplexity"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
    assert history == [(row["step"], row[key]) for row in rows]  # two points, not four
    assert history[0][1] != history[1][1]


def test_no_eval_step_or_no_committed_train_step_evaluates_nothing(committed_train, tmp_path):
    from tidal.storage import open_storage

    storage, train, tokenizer = committed_train
    assert checkpoint_eval_steps(StepGraph((*train.inputs, train)), storage) == []
    final = eval_step(DownstreamSettings(tasks=[TASK]), train, tokenizer, SEQ_LEN)
    assert checkpoint_eval_steps(StepGraph((*train.inputs, train, final)), open_storage(str(tmp_path))) == []
