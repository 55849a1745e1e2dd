"""Asset events of committed steps (operators/assets.py) with Airflow's own outlet accessors.

A first try that commits emits one event; a first try that finds the step committed emits none; a
retry that finds the step committed after its DAG run started emits it (the try that committed it was
lost with its node before its event reached the scheduler: the CI failure of the Celery node-loss test).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from airflow.sdk.execution_time.context import OutletEventAccessors

from operators.assets import emit_step_asset, step_alias
from tests.e2e.slices import write_slice_recipe
from tidal.core.load import load_pipeline


@pytest.fixture
def committed(tmp_path):
    """A pipeline whose ``fetch-brown`` step was just committed, and that first try's result."""
    pipe = load_pipeline(write_slice_recipe(tmp_path / "r.yaml", tmp_path / "store"))
    before = datetime.now(UTC) - timedelta(seconds=1)
    result = pipe.run("fetch-brown")
    assert result.status == "run"
    return pipe, result, before


def _emit(pipe, result, *, try_number: int, run_started: datetime):
    events = OutletEventAccessors()
    context = {"outlet_events": events, "ti": SimpleNamespace(try_number=try_number),
               "dag_run": SimpleNamespace(start_date=run_started)}
    out = emit_step_asset(context, pipe, result, "k", logging.getLogger("tests.assets"))
    return out, events[step_alias(pipe.recipe.name, "fetch-brown")].asset_alias_events


def test_the_committing_try_emits_one_event(committed):
    pipe, result, started = committed
    out, events = _emit(pipe, result, try_number=1, run_started=started)
    step = pipe.graph["fetch-brown"]
    assert [e.extra["step_id"] for e in events] == [step.step_id] and out["extra"]["step"] == "fetch-brown"
    assert out["uri"].endswith(step.step_id) and out["extra"]["manifest_root_hash"]


def test_a_retry_finding_its_lost_try_commit_emits_it_and_a_later_run_does_not(committed):
    pipe, _, started = committed
    skipped = pipe.run("fetch-brown")
    assert skipped.status == "skip"
    # the same DAG run's retry: the commit ended after the run started, so the lost try committed it
    _, events = _emit(pipe, skipped, try_number=2, run_started=started)
    assert [e.extra["step_id"] for e in events] == [pipe.graph["fetch-brown"].step_id]
    # a first try that finds it committed, and a retry of a run that started after the commit: nothing new
    assert _emit(pipe, skipped, try_number=1, run_started=started)[1] == []
    assert _emit(pipe, skipped, try_number=2, run_started=datetime.now(UTC) + timedelta(seconds=1))[1] == []
