"""Planning ``train.continue_from`` (tidal/core/continuation.py): the parent train step is an input
named by its id under the storage root, the continued step's id depends on the parent checkpoint's
root hash and not on where the root is, and a reference that cannot be continued is one ``error:``
line naming ``train.continue_from``."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.conftest import TINY, seal
from tidal.cli import main
from tidal.config import RecipeError
from tidal.core.pipeline import Pipeline
from tidal.core.planner import build_graph
from tidal.recipe import load_recipe
from tidal.steps import CommittedStep, derive_seed

ROOT_HASH = "ab" * 32


def commit_parent(root, root_hash=ROOT_HASH, checkpoints=(300, 400), **train) -> str:
    """A committed train step of the tiny recipe (400 steps), by hand: the step.json hash input the
    planner would record, its checkpoint manifests, sealed. Returns its step id."""
    step = build_graph(load_recipe(TINY, {f"train.{k}": v for k, v in train.items()}))["train"]
    out = root / step.step_id
    (out / "checkpoint_manifests").mkdir(parents=True)
    for n in checkpoints:
        manifest = {"step": n, "root_hash": root_hash if n == max(checkpoints) else "cd" * 32, "files": []}
        (out / "checkpoint_manifests" / f"{n}.json").write_text(json.dumps(manifest))
    final = (out / "checkpoint_manifests" / f"{max(checkpoints)}.json").read_text()
    (out / "checkpoint_manifest.json").write_text(final)
    (out / "step.json").write_text(json.dumps({"step_id": step.step_id, "hash_input": step.hash_input}))
    seal(out)
    return step.step_id


def continuing(root, parent: str, **fields) -> Pipeline:
    overrides = {"train.steps": 800, "train.continue_from": {"step": parent, **fields}}
    return Pipeline.load(TINY, overrides, storage_root=str(root))


def test_the_parent_is_an_input_and_its_checkpoint_is_hashed(tmp_path):
    parent = commit_parent(tmp_path / "root")
    pipe = continuing(tmp_path / "root", parent)
    train = pipe.graph["train"]
    ref = pipe.graph["continue-from"]
    assert isinstance(ref, CommittedStep) and ref.step_id == parent and ref in train.inputs
    assert pipe.status("continue-from") == "skip" and pipe.status("train") == "blocked"  # data steps not run
    assert train.config["continue_from"] == {
        "step": parent, "checkpoint": "final", "schedule": "continue", "checkpoint_step": 400,
        "checkpoint_root_hash": ROOT_HASH, "data_seed": derive_seed(load_recipe(TINY).seed, "train")}
    assert train.hash_input["inputs"]["continue-from"] == parent
    others = {s.name: s.step_id for s in pipe.graph if s.name not in ("train", "eval", "continue-from")}
    # the eval step reads train, so it changes with it; every other step is the fresh run's
    assert others == {s.name: s.step_id for s in build_graph(load_recipe(TINY)) if s.name not in ("train", "eval")}
    kept = continuing(tmp_path / "root", parent, checkpoint=300).graph["train"]
    assert kept.config["continue_from"]["checkpoint_step"] == 300 and kept.step_id != train.step_id


def test_plan_names_the_parent_and_the_seam(tmp_path, capsys):
    parent = commit_parent(tmp_path / "root")
    data = yaml.safe_load(TINY.read_text())
    data["train"] |= {"steps": 800, "continue_from": {"step": parent, "schedule": "rewarm"}}
    recipe = tmp_path / "continued.yaml"
    recipe.write_text(yaml.safe_dump(data))
    assert main(["plan", str(recipe), "--storage-root", str(tmp_path / "root")]) == 0
    out = capsys.readouterr().out
    assert (f"train continues {parent} from its checkpoint step 400 to step 800 (checkpoint root "
            f"{ROOT_HASH[:12]}, schedule rewarm)") in out
    assert any(line.split()[:3] == [parent, "skip", "train"] and "continue-from: read, never recomputed" in line
               for line in out.splitlines())


def test_id_follows_the_checkpoint_content_not_the_root_location(tmp_path):
    parent = commit_parent(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "b")
    here = continuing(tmp_path / "a", parent).graph["train"].step_id
    assert continuing(tmp_path / "elsewhere" / "b", parent).graph["train"].step_id == here
    assert commit_parent(tmp_path / "c", root_hash="ef" * 32) == parent  # same config, other checkpoint bytes
    assert continuing(tmp_path / "c", parent).graph["train"].step_id != here
    rewarm = continuing(tmp_path / "a", parent, schedule="rewarm").graph["train"]
    assert rewarm.step_id != here and rewarm.config["continue_from"]["schedule"] == "rewarm"


@pytest.mark.parametrize(("field", "setup", "message"), [
    ("step", lambda root, p: "train-000000000000", "is not a committed step under"),
    ("step", lambda root, p: (root / p / "_SUCCESS").unlink() or p, "is not a committed step under"),
    ("checkpoint", lambda root, p: p, "kept no checkpoint 350 (kept: [300, 400])"),
    ("steps", lambda root, p: p, "steps (400) must be above the checkpoint's step (400)"),
    ("model", lambda root, p: p, "trained another model (train.model differs in ['d_model'])"),
    ("batch_size", lambda root, p: p, "ran batch_size 16, this recipe says 8"),
    ("rewarm", lambda root, p: p, "optimizer.warmup_steps (20) must be below the new updates"),
])
def test_a_reference_that_cannot_be_continued_is_one_error_line(tmp_path, capsys, field, setup, message):
    root = tmp_path / "root"
    parent = setup(root, commit_parent(root))
    data = yaml.safe_load(TINY.read_text())
    data["train"]["steps"] = {"steps": 400, "rewarm": 410}.get(field, 800)
    data["train"]["continue_from"] = {"step": parent} | ({"checkpoint": 350} if field == "checkpoint" else {})
    if field == "model":
        data["train"]["model"]["d_model"] = 64
    if field == "batch_size":
        data["train"]["batch_size"] = 8
    if field == "rewarm":
        data["train"]["continue_from"]["schedule"] = "rewarm"
    recipe = tmp_path / "continued.yaml"
    recipe.write_text(yaml.safe_dump(data))
    assert main(["plan", str(recipe), "--storage-root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {recipe}: train.continue_from"), err
    assert message in err[0], err


def test_a_step_that_is_not_a_train_step_is_refused(tmp_path):
    root = tmp_path / "root"
    mix = build_graph(load_recipe(TINY))["mix"]
    (root / mix.step_id).mkdir(parents=True)
    (root / mix.step_id / "step.json").write_text(json.dumps({"hash_input": mix.hash_input}))
    seal(root / mix.step_id)
    with pytest.raises(RecipeError, match=r"train.continue_from.step: mix-\w+ is a mix step"):
        continuing(root, mix.step_id).graph  # noqa: B018


def test_an_edited_step_json_is_refused(tmp_path):
    root = tmp_path / "root"
    parent = commit_parent(root)
    record = json.loads((root / parent / "step.json").read_text())
    record["hash_input"]["config"]["steps"] = 401
    (root / parent / "step.json").write_text(json.dumps(record))
    with pytest.raises(RecipeError, match="hash input gives id train-"):
        continuing(root, parent).graph  # noqa: B018


def test_the_graph_needs_the_storage_root_to_resolve():
    recipe = load_recipe(TINY, {"train.steps": 800, "train.continue_from": {"step": "train-0123456789ab"}})
    with pytest.raises(RecipeError, match="train.continue_from: resolving it needs the storage root"):
        build_graph(recipe)
