"""Who sees which recipe on the on-call page (issue 43, item 5: any logged-in Airflow user saw every recipe):
the rule of operators/oncall.py ``visible_statuses``, the cheap DAG id read before any per-recipe work, and the
one line the page shows when nothing is readable. The plugin route itself, with a real auth manager and JWTs,
is tests/operators/test_oncall_access.py."""

from __future__ import annotations

import shutil

from operators.oncall import NO_RECIPES, NONE_READABLE, recipe_dag_id, recipe_status, render_page, visible_statuses
from tests.conftest import REPO

TINY = {"recipe": "tiny", "dag_id": "tidal_tiny", "path": "/r/tiny.yaml"}
OTHER = {"recipe": "other", "dag_id": "tidal_other", "path": "/r/other.yaml"}
BROKEN = {"path": "/r/broken.yaml", "error": "RecipeError: /r/broken.yaml: bad"}


def test_a_user_sees_only_the_recipes_whose_dag_they_may_read():
    shown = visible_statuses([TINY, BROKEN, OTHER], can_read={"tidal_tiny"}.__contains__, can_read_all=False)
    assert shown == [TINY]


def test_a_recipe_that_does_not_load_shows_only_to_who_reads_every_dag():
    everything = [TINY, BROKEN, OTHER]
    assert visible_statuses(everything, can_read=lambda _: True, can_read_all=False) == [TINY, OTHER]
    assert visible_statuses(everything, can_read=lambda _: False, can_read_all=True) == everything


def test_no_readable_dag_no_recipe():
    assert visible_statuses([TINY, BROKEN], can_read=lambda _: False, can_read_all=False) == []


def test_the_dag_id_read_cheaply_is_the_loaded_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("TIDAL_STORAGE_ROOT", str(tmp_path / "root"))
    shutil.copy(REPO / "recipes" / "tiny.yaml", tmp_path / "tiny.yaml")
    assert recipe_dag_id(tmp_path / "tiny.yaml") == recipe_status(tmp_path / "tiny.yaml")["dag_id"] == "tidal_tiny"
    for name, text in {"syntax": "name: [", "list": "- a", "no_name": "version: 1", "int_name": "name: 3"}.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        assert recipe_dag_id(tmp_path / f"{name}.yaml") is None, name
        assert "error" in recipe_status(tmp_path / f"{name}.yaml"), name  # so shown only to who reads all DAGs


def test_the_page_says_in_one_line_when_nothing_is_readable():
    page = render_page([], {}, hidden=True)
    assert NONE_READABLE in page and "<h2" not in page and "<table" not in page
    assert NO_RECIPES in render_page([], {}) and NONE_READABLE not in render_page([], {})
