"""`tidal verify` and `tidal lineage` on targets that are not committed steps: both commands
resolve a target alike (tidal/audit/ancestry.py resolve_target) and answer alike, through the CLI.

A target that names nothing exits 2 with the same one ``error:`` line from both commands and
prints nothing on stdout; a target none of whose steps is committed exits 1 from both."""

from __future__ import annotations

import pytest
import yaml

from tidal.cli import main
from tidal.core.runner import run_step
from tidal.integrity.signing import KEY_ENV
from tidal.kinds import KINDS, KindSpec
from tidal.steps import Step
from tidal.storage import LocalStorage


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    monkeypatch.setitem(KINDS, "fixture", KindSpec("tests.fixture_kind", 1))
    for var in (KEY_ENV, "TIDAL_STORAGE_ROOT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def store(tmp_path):
    """A storage root with one committed step, a junk directory and an empty directory in it."""
    storage = LocalStorage(tmp_path / "root")
    step = Step("writer", "fixture", {"parts": 2, "pause_s": 0.0, "fail_at": None})
    run_step(step, storage)
    (tmp_path / "root" / "junk").mkdir()
    (tmp_path / "root" / "junk" / "notes.txt").write_text("not a step\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a recipe\n")
    return {"root": tmp_path / "root", "step_id": step.step_id, "tmp": tmp_path}


def run_both(capsys, *args: str) -> dict[str, tuple[int, str, list[str], str]]:
    """``{command: (exit status, stdout, stderr lines starting with 'error:', stderr)}`` for verify
    and lineage (stderr may also hold log lines of the libraries)."""
    results = {}
    for command in ("verify", "lineage"):
        status = main([command, *args])
        captured = capsys.readouterr()
        errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
        results[command] = (status, captured.out, errors, captured.err)
    return results


@pytest.mark.parametrize(("target", "with_root", "message"), [
    ("{tmp}/missing", True, "{tmp}/missing: no such file or directory"),
    ("{tmp}/missing", False, "{tmp}/missing: no such file or directory"),
    ("{tmp}/missing.yaml", False, "{tmp}/missing.yaml: no such file or directory"),
    ("{tmp}/empty", True, "{tmp}/empty: a directory, but not a step directory"),
    ("{tmp}/empty", False, "{tmp}/empty: a directory, but not a step directory"),
    ("{tmp}/root/junk", True, "{tmp}/root/junk: a directory, but not a step directory"),
    ("junk", True, "junk: a directory under {tmp}/root, but not a step directory"),
    ("{tmp}/notes.txt", True, "{tmp}/notes.txt: a file, but not a recipe (.yaml or .yml)"),
    ("writer-000000000000", True, "writer-000000000000: not a recipe file, a step directory, a step id under"),
    ("writer-000000000000", False, "writer-000000000000: a step id or run key needs a storage root"),
    ("s3://bucket/root/writer-abc", True, "s3://bucket/root/writer-abc: a URL is not a target"),
])
def test_a_target_that_names_nothing_exits_2_with_one_identical_error(store, capsys, target, with_root, message):
    tmp = store["tmp"]
    args = [target.format(tmp=tmp)] + (["--storage-root", str(store["root"])] if with_root else [])
    results = run_both(capsys, *args)
    for command, (status, out, errors, _) in results.items():
        assert status == 2, (command, out, errors)
        assert out == "", command  # no half report before the error
        assert len(errors) == 1 and errors[0].startswith("error: " + message.format(tmp=tmp)), (command, errors)
    assert results["verify"][2] == results["lineage"][2]


def test_a_committed_step_is_fine_for_both(store, capsys):
    for args in ([str(store["root"] / store["step_id"])], [store["step_id"], "--storage-root", str(store["root"])]):
        results = run_both(capsys, *args)
        assert {command: r[0] for command, r in results.items()} == {"verify": 0, "lineage": 0}
        assert store["step_id"] in results["verify"][1] and store["step_id"] in results["lineage"][1]


def test_a_step_directory_without_success_exits_1_from_both(store, capsys):
    """A step whose _SUCCESS is gone (damaged or never committed) is still a step: verify names the
    missing marker, lineage says nothing is committed; both exit 1 with an error line."""
    step_dir = store["root"] / store["step_id"]
    (step_dir / "_SUCCESS").unlink()
    for target in ([str(step_dir)], [store["step_id"], "--storage-root", str(store["root"])]):
        results = run_both(capsys, *target)
        assert results["verify"][0] == results["lineage"][0] == 1
        assert "_SUCCESS: expected present (committed), got missing" in results["verify"][1]
        assert results["verify"][2] == ["error: 1 of 1 step(s) failed verification"]
        assert results["lineage"][2][0].startswith(f"error: nothing committed for step {target[0]}")


def test_a_recipe_with_nothing_committed_exits_1_from_both(tiny_data, tmp_path, capsys):
    tiny_data["storage_root"] = str(tmp_path / "nothing-here")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    from tidal.core.load import load_pipeline

    n_steps = len(load_pipeline(path).graph.steps)
    results = run_both(capsys, str(path))
    for command, (status, _, errors, _) in results.items():
        assert status == 1, command
        expected = (f"error: nothing committed for recipe {path}: none of its {n_steps} step(s) has "
                    f"_SUCCESS under {tmp_path / 'nothing-here'}; run it first (`tidal run RECIPE`)")
        assert errors == [expected]
    assert "not committed" in results["verify"][1] and "not committed" in results["lineage"][1]
    # an invalid recipe is a bad target for both: exit 2 and the same recipe error
    tiny_data["train"]["steps"] = 0
    path.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    results = run_both(capsys, str(path))
    assert results["verify"][0] == results["lineage"][0] == 2
    assert results["verify"][3] == results["lineage"][3]
    assert "train.steps: Input should be greater than 0" in results["verify"][3]


def test_run_keys_with_nothing_committed_or_unknown_answer_alike(tiny_data, tmp_path, capsys):
    tiny_data["storage_root"] = str(tmp_path / "store")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_data, sort_keys=False))
    from tidal.core.load import load_pipeline

    assert load_pipeline(path).parent_run("k-empty") is not None  # a real MLflow parent run, no step yet
    capsys.readouterr()
    results = run_both(capsys, "k-empty", "--recipe", str(path))
    assert results["verify"][0] == results["lineage"][0] == 1
    assert results["verify"][2] == results["lineage"][2]
    assert results["verify"][2][0].startswith("error: nothing committed for run k-empty")
    assert results["verify"][2][0].endswith("the run has not committed a step (yet)")
    results = run_both(capsys, "k-unknown", "--recipe", str(path))
    assert results["verify"][0] == results["lineage"][0] == 2
    assert results["verify"][2] == results["lineage"][2]
    assert results["verify"][2][0].startswith("error: k-unknown: not a recipe file, a step directory, a step id")
