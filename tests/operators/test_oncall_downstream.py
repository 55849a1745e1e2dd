"""The on-call page's downstream evals: the tiny recipe's status (on an empty root: none yet) and the table
the page renders from a committed eval step's results."""

from __future__ import annotations

from operators.oncall import recipe_status, render_page
from tests.conftest import REPO
from tidal.core.report import downstream


def test_page_shows_downstream_evals_once_committed(tmp_path, monkeypatch):
    monkeypatch.setenv("TIDAL_STORAGE_ROOT", str(tmp_path))
    status = recipe_status(REPO / "recipes" / "tiny.yaml")
    assert "eval" in [s["name"] for s in status["steps"]] and status["downstream"] is None
    assert "Downstream evals" not in render_page([status], {})
    status["downstream"] = downstream({"tasks": {"tidal_brown_cloze": {"metrics": {"acc": 0.375, "acc_norm": 0.3929},
                                                                       "n_examples": 56}}})
    page = render_page([status], {})
    assert "<h3>Downstream evals (final checkpoint)</h3>" in page
    assert "<tr><td>tidal_brown_cloze</td><td>acc 0.375, acc_norm 0.3929</td><td>56</td></tr>" in page
