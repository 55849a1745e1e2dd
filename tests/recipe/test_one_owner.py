"""One owner per recipe name (issue 44): two recipe files of one folder with the same ``name`` are both refused as
DAGs (tests/operators/test_dag_factory.py); the CLI on either says so in one ``warning:`` line naming both files."""

from __future__ import annotations

import shutil

from tests.conftest import TINY
from tidal.cli import main


def test_plan_on_either_file_says_so_naming_both(tmp_path, capsys):
    shutil.copy(TINY, tmp_path / "my.yaml")
    (tmp_path / "scratch.yaml").write_text(TINY.read_text().replace("min_chars: 20", "min_chars: 30"))
    (tmp_path / "notes.yaml").write_text("just: a YAML file without a name\n")  # not a recipe: not counted
    for name in ("my.yaml", "scratch.yaml"):
        assert main(["plan", str(tmp_path / name), "--storage-root", str(tmp_path / "root")]) == 0
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
        assert len(err) == 1 and err[0].startswith("warning: recipe name 'tiny' is claimed by 2 files: "), err
        assert str(tmp_path / "my.yaml") in err[0] and str(tmp_path / "scratch.yaml") in err[0]
        assert err[0].endswith("served as a DAG folder, neither becomes a DAG")
    (tmp_path / "scratch.yaml").unlink()
    assert main(["plan", str(tmp_path / "my.yaml"), "--storage-root", str(tmp_path / "root")]) == 0
    assert "warning: recipe name" not in capsys.readouterr().err


def test_the_name_is_read_without_parsing_when_it_is_a_plain_line(tmp_path):
    from tidal.recipe.loader import recipe_name

    cases = {"name: tiny\n": "tiny", "name: 'a b'  # c\n": "a b", 'name: "x"\n': "x", "other: 1\n": None,
             "{name: flow}\n": "flow", "names: no\n": None, "train:\n  name: nested\n": None}
    for i, (text, want) in enumerate(cases.items()):
        (tmp_path / f"{i}.yaml").write_text(text)
        assert recipe_name(tmp_path / f"{i}.yaml") == want, text


def test_a_bad_set_value_names_the_flag_not_the_file(capsys):
    assert main(["plan", str(TINY), "--set", "train.steps=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"error: --set: 1 problem(s) in the overrides of {TINY}:"
    assert err[1].strip() == "--set train.steps=-1: train.steps: Input should be greater than 0 (got -1)"
    # a misspelt field in a flag is named as that flag
    assert main(["plan", str(TINY), "--set", "train.steps=8", "--set", "train.batch_sise=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: --set: 1 problem(s)") and "--set train.batch_sise=4: train.batch_sise" in err[1]
