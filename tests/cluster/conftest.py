"""The ``cluster`` fixture: shared services started once per session, nodes booted per run.

Where the machine cannot host the cluster (no namespaces, not root, no PostgreSQL) the tests
are skipped with the reason, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os

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
