"""Golden step ids: every step of every recipe in ``recipes/`` keeps the id it had when pinned.

A step id is the content address of its output (docs/architecture.md section 1): a refactor that changes
one silently recomputes every committed step under a new name. The ids in
``tests/golden/step_ids.json`` were computed before the structure refactor (issue 15); a change
that must change an id bumps the kind's STEP_VERSION and re-pins the file on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tidal.core.planner import build_graph, build_suite_graph
from tidal.recipe import load_recipe
from tidal.scaling.suite import is_suite_file, load_suite

GOLDEN = json.loads((Path(__file__).parent / "golden" / "step_ids.json").read_text())


def plan_ids(path: Path) -> dict[str, str]:
    """``{step name: step id}`` of the recipe or scaling suite at ``path``."""
    if is_suite_file(path):
        suite, base = load_suite(path)
        graph = build_suite_graph(suite, base)
    else:
        graph = build_graph(load_recipe(path))
    return {step.name: step.step_id for step in graph}


def test_every_recipe_is_pinned():
    assert sorted(GOLDEN) == sorted(p.name for p in (REPO / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_step_ids_unchanged(name):
    assert plan_ids(REPO / "recipes" / name) == GOLDEN[name]
