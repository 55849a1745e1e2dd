"""The local task suite: its items are out of the training mixture, it rebuilds byte for byte, and a recipe
that names an unknown task gets one error naming the field."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tidal.config import RecipeError
from tidal.data.heldout import HeldoutSplit, is_heldout
from tidal.eval.build_tasks import TASKS_DIR, build
from tidal.eval.suite import available_tasks, task_definition
from tidal.recipe import load_recipe

TINY = REPO / "recipes" / "tiny.yaml"


def _items(task: str) -> list[dict]:
    return [json.loads(line) for line in (TASKS_DIR / f"{task}.jsonl").open()]


def test_brown_items_come_from_held_out_documents_only():
    recipe = load_recipe(TINY)
    split = HeldoutSplit(fraction=recipe.heldout_fraction, seed=recipe.seed)
    assert "brown" in recipe.train_sources
    for task in ("tidal_brown_lastword", "tidal_brown_cloze"):
        items = _items(task)
        assert items
        # held out by the split the tokenizer and tokenize steps apply: never in the tokenizer's text or the mixture
        assert all(is_heldout(it["doc_id"], split) for it in items), task
    assert len({it["doc_id"] for it in _items("tidal_brown_lastword")}) > 1


def test_udhr_items_come_from_a_source_kept_out_of_the_mixture():
    recipe = load_recipe(TINY)
    assert "udhr" in recipe.eval_sources and "udhr" not in recipe.mixture.weights
    udhr = [t for t in available_tasks() if t.startswith("tidal_udhr_")]
    assert len(udhr) == 5
    for task in udhr:
        assert len({it["doc_id"] for it in _items(task)}) == 1  # one UDHR document per language


def test_tiny_recipe_evaluates_every_local_task():
    recipe = load_recipe(TINY)
    assert recipe.evaluation.downstream.tasks == available_tasks()
    for task in available_tasks():
        assert "://" not in json.dumps(task_definition(task))  # nothing is fetched


def _clean_dir(path, texts):
    path.mkdir()
    ids = [f"{i:064x}" for i in range(len(texts))]
    table = pa.table({"id": ids, "text": texts, "ref": [f"r{i}" for i in range(len(texts))]})
    pq.write_table(table, path / "documents-00000-of-00001.parquet")
    return ids


def test_build_is_deterministic_and_uses_held_out_documents_only(tmp_path):
    words = ["home", "away", "north", "south", "west", "east", "down", "back", "around", "inside"] * 3
    split = HeldoutSplit(fraction=0.5, seed=7)
    texts = [" ".join(["word"] * 40) + f" and then the dog ran {w} ." for w in words]
    ids = _clean_dir(tmp_path / "brown", texts)
    udhr = _clean_dir(tmp_path / "udhr", ["Article one.\nArticle two."] * 5)
    shard = tmp_path / "udhr" / "documents-00000-of-00001.parquet"
    refs = ["eng.html", "fra.html", "deu_1901.html", "rus.html", "cmn_hans.html"]
    pq.write_table(pq.read_table(shard).set_column(2, "ref", pa.array(refs)), shard)
    names = build(tmp_path / "brown", tmp_path / "udhr", split, tmp_path / "a")
    build(tmp_path / "brown", tmp_path / "udhr", split, tmp_path / "b")
    assert names == available_tasks()
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name
    used = {json.loads(line)["doc_id"] for line in (tmp_path / "a" / "tidal_brown_lastword.jsonl").open()}
    held = {i for i in ids if is_heldout(i, split)}
    assert used and used <= held and used != set(ids)
    assert {json.loads(line)["target"] for line in (tmp_path / "a" / "tidal_brown_lastword.jsonl").open()} <= set(words)
    assert len(udhr) == 5


def test_unknown_task_is_one_error_naming_the_field():
    with pytest.raises(RecipeError) as err:
        load_recipe(TINY, {"evaluation.downstream.tasks": ["tidal_brown_cloze", "nope"]})
    message = str(err.value)
    assert "evaluation.downstream.tasks" in message and "nope" in message and "tidal/eval/tasks" in message
