"""The ``cluster`` fixture: shared services started once per session, nodes booted per run.

Where the machine cannot host the cluster (no namespaces, not root, no PostgreSQL) the tests
are skipped with the reason, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster, ClusterUnavailable, namespaces_unavailable


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"test cluster unavailable: {reason} (CI=true: the cluster is required here)")
    pytest.skip(f"test cluster unavailable: {reason}")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A started :class:`~tests.cluster.harness.Cluster` for the whole session (MLflow starts once)."""
    reason = namespaces_unavailable()
    if reason:
        _unavailable(reason)
    try:
        started = Cluster.start(tmp_path_factory.mktemp("cluster"))
    except ClusterUnavailable as err:
        _unavailable(str(err))
    with started:
        yield started


@pytest.fixture(scope="session")
def slice_root(cluster) -> str:
    """A storage root in the bucket for the training scenarios of the session (tests/cluster/train_scenario.py):
    the slice's upstream steps are committed there by the first scenario that needs them and skipped by the
    next (:func:`tests.cluster.train_scenario.upstream`), so the data is computed once; each scenario's
    training is its own step (its own steps / checkpoint interval: its own step id)."""
    return f"s3://tidal/train-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def local_root(tmp_path_factory) -> Path:
    """The local root of the session's reference runs in one process (:func:`tests.cluster.scenario.run_local`):
    the scenarios' recipes share most steps (the slice's data), which are computed there once. Under
    pytest-xdist the root is shared by the workers (the cluster and kube groups both compare with the same
    slice): :func:`~tests.cluster.scenario.run_local` runs one reference at a time, under a lock beside it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above each worker's own
    folder = base / "local-reference"
    folder.mkdir(exist_ok=True)
    return folder / "root"
