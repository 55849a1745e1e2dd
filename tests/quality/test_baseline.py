"""A recipe's `baseline.file` that does not exist: the recipe loads (`tidal baseline` creates the
file from a run of that recipe), `tidal plan` flags it, and a comparison fails naming the
recipe, the field, the path and the command that writes it. Scaling suites take no baseline."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, TINY
from tests.ops.test_baseline import _commit as commit
from tidal.cli import main


@pytest.fixture
def recipe(tiny_data, tmp_path, monkeypatch):
    for var in ("TIDAL_STORAGE_ROOT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    tiny_data["storage_root"] = str(tmp_path / "store")
    tiny_data["baseline"] = {"file": "baselines/nightly.json"}
    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    return path


def test_a_missing_baseline_file_is_flagged_refused_at_comparison_and_created_by_tidal_baseline(recipe, capsys):
    from tidal.core.load import load_pipeline
    from tidal.quality.baseline import BaselineError, check_pipeline
    from tidal.recipe import load_recipe

    expected = recipe.parent / "baselines" / "nightly.json"
    assert load_recipe(recipe).baseline.file == "baselines/nightly.json"  # loads: the file is an output
    assert main(["plan", str(recipe)]) == 0
    plan = capsys.readouterr().out
    assert f"baseline {expected}: MISSING: runs that compare with it fail until `tidal baseline" in plan

    pipe = load_pipeline(recipe)
    with pytest.raises(BaselineError) as err:
        check_pipeline(pipe)
    text = str(err.value)
    assert text.startswith(f"{pipe.recipe_path}: baseline.file 'baselines/nightly.json': {expected} does not exist")
    assert f"tidal baseline {pipe.recipe_path} [--from-run RUN_KEY]" in text

    # `tidal baseline` writes the missing file from the committed run, then comparison passes
    stats = pd.DataFrame([("all", "total_tokens", 1000.0)], columns=["source", "metric", "value"])
    commit(pipe, "stats", {"stats.parquet": stats}, {})
    commit(pipe, "train", {"metrics.jsonl": json.dumps({"step": 5, "loss": 6.5}) + "\n",
                           "summary.json": json.dumps({"eval_loss": 7.0})}, {})
    assert main(["baseline", str(recipe)]) == 0
    assert json.loads(expected.read_text())["loss_curve"] == [[5, 6.5]]
    assert check_pipeline(pipe) == []
    assert main(["plan", str(recipe)]) == 0
    assert f"baseline {expected}: 1 stats, 1 loss points" in capsys.readouterr().out


def test_a_recipe_without_baseline_prints_no_baseline_line(tiny_data, tmp_path, capsys):
    tiny_data["storage_root"] = str(tmp_path / "store")
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    assert main(["plan", str(path)]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("baseline ")]


def test_a_scaling_suite_takes_no_baseline(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TIDAL_STORAGE_ROOT", raising=False)
    data = yaml.safe_load((REPO / "recipes" / "suite-tiny.yaml").read_text())
    data.update(base=str(TINY), storage_root=str(tmp_path / "store"))
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["baseline", str(path), "--out", str(tmp_path / "b.json")]) == 1
    err = capsys.readouterr().err
    assert "BaselineError" in err and "a scaling suite has no single `train` step" in err
    assert not (tmp_path / "b.json").exists()
