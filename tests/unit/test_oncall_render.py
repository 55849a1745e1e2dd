"""The on-call page's renderer and status without a browser or server (issue 43, item 5): every value an
eval step's ``results.json`` holds is escaped, and a damaged ``results.json`` (or checkpoint manifest) in
one recipe gives a note on that recipe's section, never an error for the whole page."""

from __future__ import annotations

import json
import shutil

import pytest

from operators.oncall import recipe_status, render_page
from tests.conftest import REPO, seal
from tidal.core.load import load_pipeline

HOSTILE = "<img src=x onerror=alert(1)>"


def status(**overrides) -> dict:
    base = {"recipe": "x", "dag_id": "tidal_x", "path": "/r/x.yaml", "schedule": None, "recipe_hash": "0" * 64,
            "steps": [], "failing_gates": [], "failures": [], "checkpoint": None, "downstream": None,
            "mlflow": {"uri": "sqlite:///x", "link": None}}
    return {**base, **overrides}


def test_every_results_value_is_escaped():
    page = render_page([status(downstream={HOSTILE: {HOSTILE: HOSTILE, "acc": 0.5, "n_examples": HOSTILE}})], {})
    assert "<img" not in page and page.count("&lt;img src=x onerror=alert(1)&gt;") >= 3


@pytest.mark.parametrize("downstream", [
    {"t": {"acc": 0.5}},  # no n_examples
    {"t": "not a mapping"},
    ["not", "a", "mapping"],
], ids=["no-n", "entry", "tasks"])
def test_a_malformed_status_gives_a_note_on_its_recipe_only(downstream):
    good = status(recipe="good", dag_id="tidal_good", downstream={"t": {"acc": 0.25, "n_examples": 8}})
    page = render_page([status(downstream=downstream), good], {})
    assert "could not be shown" in page and "tidal_x" in page
    assert "<tr><td>t</td><td>acc 0.25</td><td>8</td></tr>" in page  # the other recipe is whole


def _commit_eval(root, results: bytes) -> None:
    pipe = load_pipeline(REPO / "recipes" / "tiny.yaml")
    step_dir = root / pipe.graph["eval"].step_id
    step_dir.mkdir(parents=True)
    (step_dir / "results.json").write_bytes(results)
    seal(step_dir)  # manifest.json and _SUCCESS, as its commit wrote them


@pytest.mark.parametrize("results", [
    b'{"tasks": {"cloze": {"n_examples": 3}}}',  # no "metrics": was KeyError 'metrics' for the whole page
    b'{"tasks": {"cloze": {"metrics": [1], "n_examples": 3}}}',
    b'{"tasks": [',
    b"\xff\xfe",
    b'{"tasks": "x"}',
], ids=["no-metrics", "metrics-list", "truncated", "not-utf8", "tasks-str"])
def test_a_damaged_results_json_is_a_note_on_its_recipe(tmp_path, monkeypatch, results):
    monkeypatch.setenv("TIDAL_STORAGE_ROOT", str(tmp_path))
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    shutil.copy(REPO / "recipes" / "tiny.yaml", recipes / "tiny.yaml")
    _commit_eval(tmp_path, results)
    st = recipe_status(recipes / "tiny.yaml")
    assert st["downstream"] is None and "results.json" in st["downstream_error"]
    page = render_page([st], {})
    assert "downstream evals unreadable" in page and "<h3>Steps (cache status)</h3>" in page


def test_a_good_results_json_still_shows(tmp_path, monkeypatch):
    monkeypatch.setenv("TIDAL_STORAGE_ROOT", str(tmp_path))
    _commit_eval(tmp_path, json.dumps({"tasks": {"cloze": {"metrics": {"acc": 0.5}, "n_examples": HOSTILE}}}).encode())
    st = recipe_status(REPO / "recipes" / "tiny.yaml")
    page = render_page([st], {})
    assert "<img" not in page and "&lt;img" in page and "acc 0.5" in page


def test_a_results_json_edited_after_its_commit_is_a_note_not_figures(tmp_path, monkeypatch):
    """Issue 43, item 5: the page read results.json without its step's manifest, so hand-edited figures
    were shown as the eval's."""
    monkeypatch.setenv("TIDAL_STORAGE_ROOT", str(tmp_path))
    _commit_eval(tmp_path, json.dumps({"tasks": {"cloze": {"metrics": {"acc": 0.25}, "n_examples": 8}}}).encode())
    pipe = load_pipeline(REPO / "recipes" / "tiny.yaml")
    results = tmp_path / pipe.graph["eval"].step_id / "results.json"
    assert recipe_status(REPO / "recipes" / "tiny.yaml")["downstream"] == {"cloze": {"acc": 0.25, "n_examples": 8}}
    results.write_text(json.dumps({"tasks": {"cloze": {"metrics": {"acc": 0.99}, "n_examples": 8}}}))
    st = recipe_status(REPO / "recipes" / "tiny.yaml")
    assert st["downstream"] is None and "sha256" in st["downstream_error"] and "manifest.json" in st["downstream_error"]
    page = render_page([st], {})
    assert "0.99" not in page and "downstream evals unreadable" in page


def test_runs_link_back_to_airflow_and_show_times_to_the_second():
    """Issue 44: each DAG and run links to its page in Airflow's UI; times are UTC to the second."""
    from datetime import UTC, datetime, timedelta, timezone

    run = {"run_id": "manual__2026-12-06T22:32:20.194596+00:00", "run_type": "manual", "state": "success",
           "start": datetime(2026, 12, 6, 22, 32, 20, 194596, tzinfo=UTC),
           "end": datetime(2026, 12, 6, 23, 37, 21, 5, tzinfo=timezone(timedelta(hours=1))),
           "failed_tasks": [], "progress": None}
    page = render_page([status()], {"tidal_x": [run, {**run, "run_id": "r2", "start": None, "end": "not a time"}]})
    assert "<a href='/dags/tidal_x'><code>tidal_x</code></a>" in page
    assert "href='/dags/tidal_x/runs/manual__2026-12-06T22%3A32%3A20.194596%2B00%3A00'" in page
    assert "<td>2026-12-06 22:32:20 UTC</td><td>2026-12-06 22:37:21 UTC</td>" in page
    assert "<td>-</td><td>not a time</td>" in page and ".194596</td>" not in page
