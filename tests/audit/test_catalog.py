"""A recipe's committed steps are found from the run plans in storage (tidal/audit/catalog.py)."""

from __future__ import annotations

import pytest

from tidal.audit.catalog import committed_steps, recipe_plans, write_run_plan
from tidal.core.runner import run_step
from tidal.kinds import KINDS, KindSpec
from tidal.steps import Step
from tidal.storage import LocalStorage


@pytest.fixture(autouse=True)
def fixture_kind(monkeypatch):
    monkeypatch.setitem(KINDS, "fixture", KindSpec("tests.fixture_kind", 1))
    monkeypatch.delenv("TIDAL_SIGNING_KEY", raising=False)


def test_committed_steps_come_from_the_plans_of_the_recipe_and_are_verified(tmp_path):
    storage = LocalStorage(tmp_path / "root")
    a, b, c = (Step("train", "fixture", {"parts": n, "pause_s": 0.0, "fail_at": None}) for n in (1, 2, 3))
    for step in (a, b, c):
        run_step(step, storage)
    never = Step("train", "fixture", {"parts": 4, "pause_s": 0.0, "fail_at": None})  # planned, not committed
    write_run_plan(storage, "tiny", "tidal_tiny__manual/1", {"train": a.step_id, "mix": "mix-0"})
    write_run_plan(storage, "tiny", "tidal_tiny__scheduled 2", {"train": b.step_id})
    write_run_plan(storage, "tiny", "tidal_tiny__again", {"train": a.step_id})
    write_run_plan(storage, "tiny", "tidal_tiny__failed", {"train": never.step_id})
    write_run_plan(storage, "other", "tidal_other__1", {"train": c.step_id})  # another recipe's step
    storage.write_object("runs/tiny/garbage.json", b"{not json")

    assert len(recipe_plans(storage, "tiny")) == 4
    found = committed_steps(storage, "tiny")
    assert [e["step_id"] for e in found] == sorted([a.step_id, b.step_id])
    by_id = {e["step_id"]: e for e in found}
    assert by_id[a.step_id]["run_keys"] == ["tidal_tiny__again", "tidal_tiny__manual/1"]
    assert all(e["verified"] and e["mismatches"] == [] for e in found)
    assert by_id[a.step_id]["uri"] == storage.step_uri(a.step_id)

    # a hand-edited committed file is a mismatch, named
    (storage.step_dir(b.step_id) / "part-1.txt").write_text("edited\n")
    found = {e["step_id"]: e for e in committed_steps(storage, "tiny")}
    assert found[a.step_id]["verified"] and not found[b.step_id]["verified"]
    assert any("part-1.txt" in m for m in found[b.step_id]["mismatches"])
