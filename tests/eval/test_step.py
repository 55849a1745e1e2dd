"""The eval step through the real runner and real lm-eval on the repository's tasks: results.json's
fields, byte-identical reruns, and task definitions that enter the step id."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.eval.conftest import SEQ_LEN
from tidal.core.planner import eval_step
from tidal.core.runner import run_step
from tidal.eval.build_tasks import TASKS_DIR
from tidal.eval.config import DownstreamSettings
from tidal.eval.step import RESULTS_JSON, lm_eval_version
from tidal.eval.suite import task_hash
from tidal.storage.layout import STEP_JSON

TASKS = ["tidal_brown_cloze", "tidal_brown_lastword", "tidal_udhr_cmn"]


@pytest.fixture(scope="module")
def evaluated(committed_train):
    storage, train, tokenizer = committed_train
    step = eval_step(DownstreamSettings(tasks=TASKS, batch_size=8), train, tokenizer, SEQ_LEN)
    run_step(step, storage)
    return storage, step


def test_results_json_records_each_task(evaluated, committed_train):
    storage, step = evaluated
    results = json.loads(storage.read_text(step.step_id, RESULTS_JSON))
    train_summary = json.loads(storage.read_text(committed_train[1].step_id, "summary.json"))
    assert sorted(results["tasks"]) == TASKS
    assert results["checkpoint_root_hash"] == train_summary["checkpoint_root_hash"]
    for name, entry in results["tasks"].items():
        assert entry["task_hash"] == task_hash(name)
        assert entry["lm_eval_version"] == lm_eval_version() == "0.4.13"
        assert entry["batch_size"] == 8 and entry["n_shot"] == 0
        assert entry["checkpoint_root_hash"] == results["checkpoint_root_hash"]
        assert len(entry["tokenizer_hash"]) == 64
    lines = len((TASKS_DIR / f"{TASKS[0]}.jsonl").read_text().splitlines())
    assert results["tasks"]["tidal_brown_cloze"]["n_examples"] == lines
    assert 0.0 <= results["tasks"]["tidal_brown_cloze"]["metrics"]["acc"] <= 1.0
    assert results["tasks"]["tidal_brown_lastword"]["metrics"]["perplexity"] > 1.0
    assert results["tasks"]["tidal_udhr_cmn"]["metrics"]["bits_per_byte"] > 0.0
    summary = json.loads(storage.read_text(step.step_id, STEP_JSON))["summary"]
    assert all(summary[f"eval_seconds/{t}"] > 0 for t in TASKS)  # wall times: the summary, not results.json
    assert "seconds" not in storage.read_text(step.step_id, RESULTS_JSON)


def test_rerun_writes_the_same_bytes(evaluated):
    storage, step = evaluated
    first = storage.read_text(step.step_id, RESULTS_JSON)
    run_step(step, storage, force=True)
    assert storage.read_text(step.step_id, RESULTS_JSON) == first


def test_editing_a_task_changes_its_hash_and_the_step_id(tmp_path, committed_train):
    _, train, tokenizer = committed_train
    shutil.copytree(TASKS_DIR, tmp_path / "tasks")
    before = task_hash("tidal_brown_cloze", tmp_path / "tasks")
    assert before == task_hash("tidal_brown_cloze")
    data = tmp_path / "tasks" / "tidal_brown_cloze.jsonl"
    data.write_text(data.read_text().replace('"label": 0', '"label": 1', 1))
    assert task_hash("tidal_brown_cloze", tmp_path / "tasks") != before
    step = eval_step(DownstreamSettings(tasks=TASKS), train, tokenizer, SEQ_LEN)
    assert step.config["task_hashes"] == {t: task_hash(t) for t in TASKS}
    edited = {**step.config, "task_hashes": {**step.config["task_hashes"],
                                             "tidal_brown_cloze": task_hash("tidal_brown_cloze", tmp_path / "tasks")}}
    assert type(step)(step.name, step.kind, edited, step.inputs).step_id != step.step_id


def test_a_task_edited_after_planning_is_refused(committed_train, trained):
    from tidal.eval.config import EvalStepConfig
    from tidal.eval.step import evaluate

    _, train, tokenizer = committed_train
    cfg = dict(eval_step(DownstreamSettings(tasks=TASKS[:1]), train, tokenizer, SEQ_LEN).config)
    cfg["task_hashes"] = {TASKS[0]: "0" * 64}
    with pytest.raises(ValueError, match="plan again"):
        evaluate(trained, EvalStepConfig.model_validate(cfg), None)
