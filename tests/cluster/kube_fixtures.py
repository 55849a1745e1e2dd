"""The ``kube`` and ``installed`` fixtures: one real Kubernetes control plane per session (tests/cluster/kube.py),
for tests/deploy and tests/cluster (a plugin of tests/conftest.py).

Skipped with the reason where the tools are not built or etcd is missing, except under
``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os

import pytest

from tests.cluster.harness import ClusterUnavailable
from tests.cluster.kube import KubeServer
from tests.deploy.chart import chart_copy
from tests.deploy.kube_checks import install


@pytest.fixture(scope="session")
def kube(tmp_path_factory):
    """A started :class:`~tests.cluster.kube.KubeServer` with scheduler, controllers and KWOK."""
    try:
        server = KubeServer.start(tmp_path_factory.mktemp("kube"), nodes=True)
    except ClusterUnavailable as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Kubernetes API server unavailable: {err} (CI=true: it is required here)")
        pytest.skip(f"Kubernetes API server unavailable: {err}")
    with server:
        yield server


@pytest.fixture(scope="session")
def installed(kube, tmp_path_factory) -> dict:
    """helm/tidal installed on ``kube`` with the prod values (kubectl apply of helm template); its values."""
    return install(kube, chart_copy(tmp_path_factory.mktemp("chart")), "values-prod.yaml")
