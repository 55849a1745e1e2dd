"""Same recipe, same bytes: two runs into two storage roots produce identical outputs.

Data steps are compared by manifest root hash (every output file's sha256). The gate is
compared by its result (its GX Data Docs carry render timestamps), and training by its
loss curve and the content hash of the final parameters (orbax file names and metadata
timestamps differ between identical runs; the arrays do not).

Slow (not in CI): tests/cluster/test_share_nothing.py proves the same more strongly in CI, every step of
the slice on its own node against a run in one local process, by the same comparison.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.slices import write_slice_recipe


def run_all(tmp_path, name: str):
    from tidal.core.load import load_pipeline

    recipe = write_slice_recipe(tmp_path / f"{name}.yaml", tmp_path / name)
    pipe = load_pipeline(recipe)
    for step in pipe.graph:
        pipe.run(step.name)
    return pipe


@pytest.mark.slow
def test_two_runs_give_identical_outputs(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("TIDAL_STORAGE_ROOT", raising=False)
    first, second = run_all(tmp_path, "a"), run_all(tmp_path, "b")
    assert [s.step_id for s in first.graph] == [s.step_id for s in second.graph]
    for step in first.graph:
        one, two = (json.loads((p.storage.step_dir(step.step_id) / "step.json").read_text()) for p in (first, second))
        if step.kind not in ("gate", "train"):
            assert one["manifest_root_hash"] == two["manifest_root_hash"], step.name
    gate = [json.loads((p.storage.step_dir(first.graph["gate"].step_id) / "gate_result.json").read_text())
            for p in (first, second)]
    assert gate[0] == gate[1] and gate[0]["success"]
    train_id = first.graph["train"].step_id
    summaries = [json.loads((p.storage.step_dir(train_id) / "summary.json").read_text()) for p in (first, second)]
    assert summaries[0]["params_sha256"] == summaries[1]["params_sha256"]
    assert summaries[0]["final_train_loss"] == summaries[1]["final_train_loss"]
    curves = [
        [(r["step"], r["loss"])
         for r in map(json.loads, (p.storage.step_dir(train_id) / "metrics.jsonl").read_text().splitlines())
         if "loss" in r]  # the step-0 line holds the evals only
        for p in (first, second)
    ]
    assert curves[0] == curves[1] and len(curves[0]) == 6
