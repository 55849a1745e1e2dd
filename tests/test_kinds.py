"""Each step kind's typed interface (tidal/kinds.py): its config model, planning function and run
function resolve; every planned config is parsed into its model at plan time (a bad one is a
RecipeError naming the step and the field), and the model's JSON (what a job command reads)
parses back to the same model."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BaseModel

from tests.conftest import REPO
from tidal.core.planner import build_graph, build_suite_graph
from tidal.core.plans import planned
from tidal.kinds import KINDS, kind_spec
from tidal.recipe import RecipeError, parse_recipe
from tidal.scaling.suite import load_suite


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_names_resolve(kind):
    spec = KINDS[kind]
    assert issubclass(spec.config_model(), BaseModel)
    assert callable(spec.planner()) and spec.plan.startswith("tidal.core.plans.")
    assert callable(spec.runner())


def graphs(tiny_data):
    """Every kind planned: the tiny recipe, a variant with every optional step and split, and the suite."""
    full = {**tiny_data, "decontamination": {}}
    full["evaluation"] = {**full.get("evaluation", {}), "heldout": {"fraction": 0.1}}
    suite, base = load_suite(REPO / "recipes" / "suite-tiny.yaml")
    return [build_graph(parse_recipe(tiny_data)), build_graph(parse_recipe(full)), build_suite_graph(suite, base)]


def test_every_planned_config_is_its_kinds_model(tiny_data):
    kinds = set()
    for graph in graphs(tiny_data):
        for step in graph:
            spec = kind_spec(step.kind)
            assert isinstance(step.model, spec.config_model()), step.name
            assert step.typed_config is step.model  # parsed once, at plan time
            assert spec.parse_config(step.config) == step.model  # the hashed dict means the same
            assert spec.parse_config(spec.config_json(step.model)) == step.model, step.name  # one serialized form
            kinds.add(step.kind)
    assert kinds == set(KINDS)


def test_a_bad_planned_config_is_a_recipe_error_at_plan_time():
    with pytest.raises(RecipeError, match=r"step clean-x \(clean\).*shards: Input should be greater than or equal"):
        planned("clean-x", "clean", {"source": "x", "input": "fetch-x", "shards": 0})
    with pytest.raises(RecipeError, match=r"step mix \(mix\).*bogus: unknown key"):
        planned("mix", "mix", {"bogus": 1})


def test_a_bad_config_from_a_planning_function_names_the_step(tiny_data, monkeypatch):
    from tidal.recipe.data import Source

    monkeypatch.setattr(Source, "clean_overrides", lambda self, defaults: {"language": {"allow": 3}})
    with pytest.raises(RecipeError, match=r"step clean-brown \(clean\).*language"):
        build_graph(parse_recipe(tiny_data))


def test_planning_imports_no_beam_jax_or_gx():
    code = ("import sys; from tidal.core.planner import build_graph; from tidal.recipe import load_recipe; "
            f"build_graph(load_recipe({str(REPO / 'recipes' / 'tiny.yaml')!r})); "
            "print(sorted(m for m in ('apache_beam', 'jax', 'great_expectations') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
