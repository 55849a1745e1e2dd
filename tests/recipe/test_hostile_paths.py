"""Issue 43, item 6: paths a recipe names. A ``licences:`` file must be a regular file under the recipe
file's directory, read bounded in bytes; a file elsewhere is refused before a byte of it is read (so none
of its values is echoed), a device or FIFO at once (``/dev/zero`` used to grow ``tidal plan`` to 9 GB). A
source ``path:`` that is a device or FIFO is refused at load instead of hanging the fetch (and the DAG
file). Each is one ``error:`` line naming the file, the field and the rule."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import yaml

from tests.conftest import REPO
from tidal.recipe import RecipeError, load_recipe

SECRET = "hunter2-SECRET-VALUE"


def write(folder, data, name="recipe.yaml"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load_within(path, seconds: float = 20):
    """load_recipe(path) in a thread: a read that hangs (a FIFO, /dev/zero) fails the test, not the suite."""
    result: dict = {}

    def run():
        try:
            result["recipe"] = load_recipe(path)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            result["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"loading {path} did not return within {seconds} s"
    if "error" in result:
        raise result["error"]
    return result["recipe"]


def test_a_licences_file_outside_the_recipe_directory_is_refused_and_never_echoed(tmp_path, tiny_data):
    secrets = tmp_path / "secretdir"
    secrets.mkdir()
    (secrets / "secrets.yaml").write_text(yaml.safe_dump({"LicenseRef-x": {"uses": [SECRET], "reason": SECRET}}))
    for name in ("../secretdir/secrets.yaml", str(secrets / "secrets.yaml")):
        recipe = write(tmp_path / "recipes", {**tiny_data, "licences": name})
        with pytest.raises(RecipeError) as err:
            load_within(recipe)
        assert SECRET not in str(err.value)
        assert "licences" in str(err.value) and "outside the recipe's directory" in str(err.value)


def test_a_symlink_beside_the_recipe_to_a_file_outside_is_refused(tmp_path, tiny_data):
    (tmp_path / "secrets.yaml").write_text(yaml.safe_dump({"LicenseRef-x": {"uses": [SECRET], "reason": SECRET}}))
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "lic.yaml").symlink_to(tmp_path / "secrets.yaml")
    with pytest.raises(RecipeError, match="outside the recipe's directory") as err:
        load_within(write(folder, {**tiny_data, "licences": "lic.yaml"}))
    assert SECRET not in str(err.value)


def test_a_licences_device_or_fifo_is_refused_at_once(tmp_path, tiny_data):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "zero.yaml").symlink_to("/dev/zero")
    os.mkfifo(folder / "fifo.yaml")
    with pytest.raises(RecipeError, match=r"licences.*/dev/zero is outside the recipe's directory"):
        load_within(write(folder, {**tiny_data, "licences": "zero.yaml"}))
    with pytest.raises(RecipeError, match=r"licences.*fifo.yaml: cannot read licences: a FIFO, not a regular file"):
        load_within(write(folder, {**tiny_data, "licences": "fifo.yaml"}))


def test_a_recipe_file_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "r.yaml")
    with pytest.raises(RecipeError, match="not a regular file"):
        load_within(tmp_path / "r.yaml")


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_source_path_that_is_a_device_or_fifo_is_refused_at_load(tmp_path, tiny_data, kind):
    folder = tmp_path / "recipes"
    folder.mkdir()
    if kind == "fifo":
        os.mkfifo(folder / "notes.jsonl")
        where = "notes.jsonl"
    else:
        where = "/dev/zero"
    tiny_data["sources"]["notes"] = {"format": "jsonl", "path": where, "licence": "MIT"}
    with pytest.raises(RecipeError, match=r"sources\.notes\.path: .* not a regular file or directory"):
        load_within(write(folder, tiny_data))


def test_tidal_plan_prints_one_error_line_for_licences_dev_zero(tmp_path, tiny_data):
    recipe = write(tmp_path, {**tiny_data, "licences": "/dev/zero"})
    plan = subprocess.run([sys.executable, "-m", "tidal", "plan", str(recipe), "--storage-root", str(tmp_path / "s")],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 2, plan.stderr[-2000:]
    assert len([line for line in plan.stderr.splitlines() if line.startswith("error:")]) == 1, plan.stderr[-2000:]
    assert "licences" in plan.stderr and "/dev/zero" in plan.stderr and "Traceback" not in plan.stderr


def test_a_licences_file_beside_the_recipe_is_still_read(tmp_path, tiny_data):
    folder = tmp_path / "recipes"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "lic.yaml").write_text(yaml.safe_dump({"LicenseRef-x": {"uses": ["research"], "reason": "r"}}))
    recipe = load_within(write(folder, {**tiny_data, "licences": "sub/lic.yaml"}))
    assert recipe.licences["LicenseRef-x"].reason == "r"
