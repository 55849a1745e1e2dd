"""Fixtures for storage tests: one moto S3 server per session, a fresh bucket per test."""

from __future__ import annotations

import uuid

import pytest

from tests.storage.servers import FaultPlan, FaultProxy, MotoServer
from tidal.kinds import KINDS, KindSpec


@pytest.fixture(scope="session")
def moto_server():
    """``python -m moto.server`` on a free loopback port for the whole session."""
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(moto_server, monkeypatch, tmp_path):
    """Credentials, endpoint and cache in the environment (as a worker would have them)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("TIDAL_S3_ENDPOINT_URL", moto_server.endpoint)
    monkeypatch.setenv("TIDAL_STORAGE_CACHE", str(tmp_path / "cache"))
    return moto_server


@pytest.fixture
def bucket(s3_env) -> str:
    """A fresh, empty bucket on the moto server."""
    import boto3

    name = f"tidal-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_env.endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture
def proxy(s3_env, monkeypatch):
    """A fault-injecting proxy in front of moto; storage opened afterwards talks to it."""
    fault_proxy = FaultProxy(s3_env.port, FaultPlan()).start()
    monkeypatch.setenv("TIDAL_S3_ENDPOINT_URL", fault_proxy.endpoint)
    yield fault_proxy
    fault_proxy.stop()


@pytest.fixture(autouse=True)
def test_kinds(monkeypatch):
    """The real small step kinds used here (tests/fixture_kind.py and tests/storage/blob_kind.py)."""
    monkeypatch.setitem(KINDS, "fixture", KindSpec("tests.fixture_kind", 1))
    monkeypatch.setitem(KINDS, "blob", KindSpec("tests.storage.blob_kind", 1))
    monkeypatch.setitem(KINDS, "concat", KindSpec("tests.storage.concat_kind", 1))
    monkeypatch.setitem(KINDS, "raw", KindSpec("tests.storage.raw_kind", 1))
