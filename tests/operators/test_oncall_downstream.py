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


def test_page_shows_what_the_launch_sized_the_train_step_as_beside_what_it_measured(tmp_path, monkeypatch):
    """Issue 40, item 7: the committed train step's ``provenance.sizing`` (tidal/train/preflight.py)."""
    import json

    from tests.conftest import seal
    from tidal.core.load import load_pipeline

    monkeypatch.setenv("TIDAL_STORAGE_ROOT", str(tmp_path))
    monkeypatch.delenv("TIDAL_SIGNING_KEY", raising=False)
    recipe = REPO / "recipes" / "tiny.yaml"
    sizing = {"method": "compiled", "where": "v5e 2x2 (4 chips, 1 host)", "mesh": {"data": 1, "fsdp": 4, "tensor": 1},
              "chips": 4, "hbm_per_chip_bytes": 3 * 2**29, "hbm_capacity_bytes": 16 * 2**30,
              "predicted_step_s": 0.0123, "predicted_mfu": 0.412, "predicted_tokens_per_s": 1e6}
    out = load_pipeline(recipe).storage.step_dir(load_pipeline(recipe).graph["train"].step_id)
    out.mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    seal(out)  # committed as a GKE launch commits it: step.json with the trainer's summary and the sizing
    (out / "step.json").write_text(json.dumps({"summary": {"step_time_s": 0.015, "mfu": 0.337},
                                               "provenance": {"launcher": "gke", "sizing": sizing}}))
    status = recipe_status(recipe)
    assert status["sizing"] == {**sizing, "measured": {"step_time_s": 0.015, "mfu": 0.337, "tokens_per_second": None}}
    page = render_page([status], {})
    assert ("<h3>Sizing</h3><p class='sizing'>sizing: v5e 2x2 (4 chips, 1 host), mesh data=1 fsdp=4 tensor=1, 1.50 of "
            "16.00 GiB HBM per chip (compiled)</p><p class='sizing'>step time: predicted 12.3 ms, MFU 41.2%; measured "
            "15.0 ms per step, MFU 33.7%</p>") in page
    (out / "step.json").write_text("[1, 2]")  # damaged: the page stays up without the section
    assert recipe_status(recipe)["sizing"] is None
