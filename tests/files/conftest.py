"""Fixtures for reading committed steps in place: the moto S3 server of tests/storage, and a helper
that uploads a local step directory to a bucket prefix as a commit would leave it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.storage.conftest import bucket, moto_server, proxy, s3_env  # noqa: F401 - fixtures used here


@pytest.fixture
def upload(s3_env, bucket):  # noqa: F811 - the fixtures imported above
    """``upload(step_dir, step_id) -> "s3://bucket/root/{step_id}/"``: every file of ``step_dir``
    put under that prefix (relative paths kept)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env.endpoint, region_name="us-east-1")

    def put(step_dir: Path, step_id: str) -> str:
        for path in sorted(p for p in Path(step_dir).rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, f"root/{step_id}/{path.relative_to(step_dir).as_posix()}")
        return f"s3://{bucket}/root/{step_id}/"

    put.client, put.bucket = client, bucket
    return put
