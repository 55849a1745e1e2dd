"""Fuzz tests (hypothesis, derandomized, a bounded number of cases) of what tidal renders from files a user
or a damaged bucket controls (issue 43's hostile-input suite; tests/data/test_fuzz.py covers the readers
and the recipe loader):

- an eval step's ``results.json`` (random JSON, random shapes at every level) through
  :func:`tidal.core.report.downstream`, the text report and the on-call page: a damaged file is a
  ``ValueError`` naming ``results.json`` (the page turns it into a note), never another exception;
- the on-call page's statuses and runs with random values at every field: the page always renders, and
  a markup string planted anywhere never reaches it unescaped.

Each test prints ``FUZZ <name>: <cases> cases, <handled> handled with one note, <failed> failed``.
"""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from operators.oncall import render_page
from tidal.core.report import _format_downstream, downstream

CASES = 300
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MARKUP = "<script>x()</script><img src=x onerror=alert(1)>"

leaves = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
          | st.text(max_size=20) | st.just(MARKUP))
json_values = st.recursive(leaves, lambda children: st.lists(children, max_size=4)
                           | st.dictionaries(st.text(max_size=8) | st.just(MARKUP), children, max_size=4),
                           max_leaves=25)


@st.composite
def results_documents(draw):
    """results.json as an eval step writes it, with random damage at a random depth."""
    metrics = draw(st.dictionaries(st.text(max_size=10) | st.just(MARKUP), json_values, max_size=3))
    entry = {"metrics": metrics, "n_examples": draw(json_values)}
    if draw(st.booleans()):
        entry = draw(st.dictionaries(st.sampled_from(["metrics", "n_examples", "x"]), json_values, max_size=3))
    tasks = draw(st.dictionaries(st.text(max_size=10) | st.just(MARKUP), st.just(entry) | json_values, max_size=3))
    doc = draw(st.sampled_from([{"tasks": tasks}, {"tasks": draw(json_values)}, draw(json_values)]))
    return doc


def status(**overrides) -> dict:
    base = {"recipe": "x", "dag_id": "tidal_x", "path": "/r/x.yaml", "schedule": None, "recipe_hash": "0" * 64,
            "steps": [], "failing_gates": [], "failures": [], "checkpoint": None, "downstream": None,
            "mlflow": {"uri": "sqlite:///x", "link": None}}
    return {**base, **overrides}


def assert_escaped(page: str) -> None:
    assert "<script" not in page and "<img" not in page, page[:3000]


def test_results_json_of_any_shape_is_rendered_or_refused_with_one_note():
    counts: Counter = Counter()

    @FUZZ
    @given(doc=results_documents())
    def case(doc):
        raw = json.dumps(doc, allow_nan=True)
        try:
            tasks = downstream(json.loads(raw))
        except ValueError as err:  # the documented refusal: the page and the report turn it into one note
            assert "results.json" in str(err) and "\n" not in str(err)
            counts["refused with one note"] += 1
            page = render_page([status(downstream=None, downstream_error=f"e/results.json: ValueError: {err}")], {})
            assert "downstream evals unreadable" in page
            assert_escaped(page)
            return
        counts["rendered"] += 1
        page = render_page([status(downstream=tasks)], {})
        assert "</html>" in page
        assert_escaped(page)
        _format_downstream(tasks)  # the text report's lines: any value prints

    case()
    print(f"FUZZ results.json: {sum(counts.values())} cases, {counts['rendered']} rendered, "
          f"{counts['refused with one note']} handled with one note, 0 failed")
    assert counts["rendered"] > 10 and counts["refused with one note"] > 10  # both paths were exercised


FIELDS = ("recipe", "dag_id", "path", "schedule", "recipe_hash", "storage_root", "steps", "failing_gates",
          "failures", "checkpoint", "downstream", "downstream_error", "mlflow")


@st.composite
def statuses(draw):
    """A recipe status with random values (markup among them) at random fields, and its runs."""
    st_ = status(**draw(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5)))
    if draw(st.booleans()):
        st_["error"] = draw(json_values)
    runs = {str(st_.get("dag_id")): draw(st.lists(st.dictionaries(
        st.sampled_from(["run_id", "run_type", "state", "start", "end", "failed_tasks", "upstream_failed",
                         "mlflow_link", "progress"]), json_values, max_size=6), max_size=3))}
    return st_, runs


def test_the_oncall_page_renders_any_status_and_escapes_every_value():
    counts: Counter = Counter()

    @FUZZ
    @given(pair=statuses(), good=st.booleans())
    def case(pair, good):
        hostile, runs = pair
        shown = [hostile] + ([status(recipe="good", dag_id="tidal_good")] if good else [])
        page = render_page(shown, runs)
        assert page.endswith("</body></html>")
        assert_escaped(page)
        if good:  # another recipe's section is whole whatever this one holds
            assert "tidal_good" in page
        counts["noted" if "could not be shown" in page else "rendered"] += 1

    case()
    print(f"FUZZ on-call page: {sum(counts.values())} cases, {counts['rendered']} rendered, "
          f"{counts['noted']} handled with one note, 0 failed")

