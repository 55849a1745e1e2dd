"""Step ids: derived from what a step computes, and from nothing else."""

from __future__ import annotations

import importlib

import pytest

from tidal.core.planner import build_graph
from tidal.kinds import KINDS
from tidal.recipe import parse_recipe
from tidal.steps import Step, StepGraph, derive_seed


def ids(data, **overrides):
    return {s.name: s.step_id for s in build_graph(parse_recipe(data, overrides=overrides))}


def test_same_recipe_same_ids(tiny_data):
    assert ids(tiny_data) == ids(tiny_data)


def test_training_field_changes_only_train(tiny_data):
    before, after = ids(tiny_data), ids(tiny_data, **{"train.steps": 70})
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"train", "eval"}  # the eval step reads the train step: a descendant


def test_tokenize_field_changes_tokenize_and_descendants(tiny_data):
    before, after = ids(tiny_data), ids(tiny_data, **{"tokenize.seq_len": 64})
    changed = {name for name in before if before[name] != after[name]}
    graph = build_graph(parse_recipe(tiny_data))
    expected = set()
    for src in ("brown", "gcide", "songci", "udhr"):
        expected |= {f"tokenize-{src}", *graph.descendants(f"tokenize-{src}")}
    assert changed == expected
    assert not any(name.startswith(("fetch-", "clean-")) or name == "tokenizer" for name in changed)


def test_seed_changes_only_seeded_steps(tiny_data):
    data = {**tiny_data, "evaluation": {"sources": ["udhr"]}}  # no held-out split
    before, after = ids(data), ids(data, seed=1)
    assert {n for n in before if before[n] != after[n]} == {"mix", "stats", "gate", "train"}


def test_seed_draws_the_heldout_split(tiny_data):
    # the split hashes document ids with the recipe seed: the tokenizer and every step after it change
    before, after = ids(tiny_data), ids(tiny_data, seed=1)
    changed = {n for n in before if before[n] != after[n]}
    assert changed == {"tokenizer", *build_graph(parse_recipe(tiny_data)).descendants("tokenizer")}
    assert not any(name.startswith(("fetch-", "clean-")) for name in changed)


@pytest.mark.parametrize(
    "overrides",
    [{"storage_root": "/somewhere/else"}, {"tracking_uri": "http://mlflow:5000"}, {"description": "other"}],
)
def test_location_fields_change_no_id(tiny_data, overrides):
    assert ids(tiny_data) == ids(tiny_data, **overrides)


def test_step_version_bump_changes_id(monkeypatch):
    step = Step("clean-x", "clean", {"a": 1})
    before = step.step_id
    monkeypatch.setitem(KINDS, "clean", KINDS["clean"].__class__("tidal.data.clean", KINDS["clean"].version + 1))
    assert Step("clean-x", "clean", {"a": 1}).step_id != before


def test_id_shape():
    step = Step("fetch-x", "fetch", {"b": [1, 2], "a": None})
    name, _, digest = step.step_id.rpartition("-")
    assert name == "fetch-x" and len(digest) == 12 and int(digest, 16) >= 0
    assert Step("fetch-x", "fetch", {"a": None, "b": [1, 2]}).step_id == step.step_id


def test_graph_refuses_duplicates_and_unordered_inputs():
    a = Step("a", "fetch", {})
    with pytest.raises(ValueError, match="two steps are named 'a'"):
        StepGraph((a, a))
    with pytest.raises(ValueError, match="reads 'a', which is not before it"):
        StepGraph((Step("b", "clean", {}, (a,)),))


def test_derived_seeds_differ_per_step():
    assert derive_seed(1, "mix") == derive_seed(1, "mix")
    assert derive_seed(1, "mix") != derive_seed(1, "train") != derive_seed(2, "mix")
    assert 0 <= derive_seed(1, "mix") < 2**63


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_module_versions_match_table(kind):
    module = importlib.import_module(KINDS[kind].module)
    assert module.STEP_VERSION == KINDS[kind].version
    assert getattr(module, "RESUMABLE", False) == KINDS[kind].resumable


def test_ancestors_are_what_a_step_reads_and_mirror_descendants(tiny_data):
    graph = build_graph(parse_recipe(tiny_data))
    assert graph.ancestors("fetch-brown") == []
    train = graph.ancestors("train")
    assert {"fetch-brown", "clean-brown", "tokenizer", "mix"} <= set(train) and "train" not in train
    assert "fetch-udhr" in train  # UDHR is evaluated: train reads its tokenize step
    assert train == [s.name for s in graph if s.name in set(train)]  # graph order
    for name in (s.name for s in graph):  # a reads b exactly when b's descendants hold a
        assert all(name in graph.descendants(up) for up in graph.ancestors(name))
    with pytest.raises(KeyError, match="no step named"):
        graph.ancestors("nope")
