"""Tools show the run asked for: a run with overrides (the trigger form's ``train_steps``, or
``tidal run --set``) planned other step ids than the recipe as written, and ``tidal report
--run-key``, ``tidal verify RUN_KEY``, ``tidal lineage RUN_KEY`` and the on-call page's run row
find that run's own ids from its plan in the storage root and its MLflow parent run."""

from __future__ import annotations

import json

from tests.audit.test_ancestry import clean_env, small_recipe  # noqa: F401 - fixture
from tidal.audit.catalog import pipeline_of_run, recorded_overrides, run_plan
from tidal.cli import main
from tidal.core.load import load_pipeline


def test_report_verify_lineage_and_oncall_follow_the_runs_own_overrides(tmp_path, clean_env, capsys):  # noqa: F811
    """The whole small pipeline with ``train.steps`` 4 -> 6 (about 2 minutes on 2 cores)."""
    path = small_recipe(tmp_path, "overrides_ci")
    assert main(["run", str(path), "--set", "train.steps=6", "--run-key", "ov1"]) == 0
    capsys.readouterr()
    as_written = load_pipeline(path)
    ran = load_pipeline(path, {"train.steps": 6})
    train_id = ran.graph["train"].step_id
    assert train_id != as_written.graph["train"].step_id
    assert not as_written.storage.is_committed(as_written.graph["train"].step_id)

    plan = run_plan(ran.storage, "overrides_ci", "ov1")
    assert plan is not None and plan["overrides"] == {"train.steps": 6} and plan["steps"]["train"] == train_id
    assert recorded_overrides(as_written, "ov1") == {"train.steps": 6}
    assert pipeline_of_run(path, "ov1").graph["train"].step_id == train_id
    # without the plan, the MLflow parent run's tag answers
    (tmp_path / "store" / "runs" / "overrides_ci" / "ov1.json").unlink()
    assert recorded_overrides(as_written, "ov1") == {"train.steps": 6}

    assert main(["report", str(path), "--run-key", "ov1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tidal run of recipe overrides_ci (run key ov1, succeeded; overrides: train.steps=6)"), out
    assert "over 6 training steps" in out, out
    assert "NOT COMMITTED" not in out, out

    assert main(["verify", "ov1", "--recipe", str(path), "--json"]) == 0
    verified = json.loads(capsys.readouterr().out)
    assert train_id in json.dumps(verified), verified
    assert main(["lineage", "ov1", "--recipe", str(path), "--json"]) == 0
    lineage = json.loads(capsys.readouterr().out)
    assert lineage["final"]["step_id"] == train_id

    from operators.oncall import runs_progress

    status = {"path": str(path), "recipe": "overrides_ci"}
    main(["run", str(path), "--set", "train.steps=6", "--run-key", "ov2"])  # all cached: rewrites a plan
    capsys.readouterr()
    progress = runs_progress(status, ["ov2", "no-such-run"])
    assert set(progress) == {"ov2"}
    assert progress["ov2"]["committed"] == progress["ov2"]["planned"] == len(ran.graph.steps)
    assert progress["ov2"]["overrides"] == {"train.steps": 6}

    # issue 44: without --run-key, the newest run (overrides and all); an unknown key is exit 2 naming the nearest
    assert main(["report", str(path)]) == 0
    assert capsys.readouterr().out.startswith("tidal run of recipe overrides_ci (run key ov2, succeeded; overrides: "
                                              "train.steps=6)")
    assert main(["report", str(path), "--run-key", "ov3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no run with key 'ov3'; nearest: ov2, ov1" in err[0], err
