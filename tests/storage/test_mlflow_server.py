"""MLflow in production shape: a tracking server with a PostgreSQL backend store and
server-proxied artifacts in an S3 bucket (moto on loopback). Only the server holds bucket
credentials; the client (tidal's Tracker) talks HTTP to the server and has none.

PostgreSQL is expected on 127.0.0.1:5432 (trust auth). If it is unreachable the test is
skipped with that reason, except under ``CI=true``, where it fails instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import boto3
import pytest

from tests.cluster.node import _stop_group
from tests.storage.servers import free_port
from tidal.integrity.hashing import build_manifest
from tidal.tracking import Tracker

PG = {"host": "127.0.0.1", "port": 5432}
CREDENTIALS = {"aws_access_key_id": "server-only", "aws_secret_access_key": "server-only"}


def _pg_connect():
    import psycopg2

    last = None
    for user in ("postgres", "root"):
        try:
            conn = psycopg2.connect(dbname="postgres", user=user, connect_timeout=5, **PG)
            conn.autocommit = True
            return conn, user
        except psycopg2.OperationalError as err:
            last = err
    raise ConnectionError(f"PostgreSQL on {PG['host']}:{PG['port']} is unreachable: {last}")


@pytest.fixture
def postgres_db():
    """A fresh database with a unique name, dropped afterwards; yields its SQLAlchemy URI."""
    try:
        conn, user = _pg_connect()
    except ConnectionError as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{err} (CI=true: PostgreSQL is required here)")
        pytest.skip(str(err))
    name = f"tidal_mlflow_{uuid.uuid4().hex[:10]}"
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg2://{user}@{PG['host']}:{PG['port']}/{name}"
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.close()


@pytest.fixture
def mlflow_server(moto_server, postgres_db, tmp_path):
    """``mlflow server`` in its own process group: Postgres store, artifacts proxied to s3://bucket/mlflow."""
    bucket = f"mlflow-{uuid.uuid4().hex[:10]}"
    s3 = boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1", **CREDENTIALS)
    s3.create_bucket(Bucket=bucket)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    env |= {"AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": "us-east-1", "MLFLOW_S3_ENDPOINT_URL": moto_server.endpoint,
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job runner process: not used here
    log_path = tmp_path / "mlflow-server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", postgres_db,
             "--artifacts-destination", f"s3://{bucket}/mlflow", "--serve-artifacts"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # DB migrations on a busy 2-core machine
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not come up (exit {proc.poll()}):\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"url": url, "bucket": bucket, "s3": s3}
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (uvicorn workers too), SIGKILL after 20 s."""
    _stop_group(proc, grace_s=20)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoint_manifest_and_20mb_artifact_round_trip(mlflow_server, tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("AWS_") or k == "MLFLOW_S3_ENDPOINT_URL"]:
        monkeypatch.delenv(key)  # the client holds no bucket credentials at all
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "params.bin").write_bytes(os.urandom(20 * 2**20))  # 20 MiB
    manifest = build_manifest(checkpoint)
    manifest_path = tmp_path / "checkpoint_manifest.json"
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")

    tracker = Tracker(mlflow_server["url"], experiment=f"tidal-prod-{uuid.uuid4().hex[:6]}",
                      pending_dir=tmp_path / "pending")
    parent = tracker.parent_run("run-1", params={"recipe": "tiny"}, tags={"tidal.recipe": "tiny"})
    run_id = tracker.log_step(parent, "train", "train-0123456789ab", "train", "run", {"loss": 2.5},
                              artifacts=[manifest_path, checkpoint / "params.bin"],
                              tags={"tidal.checkpoint_root_hash": manifest["root_hash"]})
    assert parent and run_id, f"tracking failed; buffered: {list((tmp_path / 'pending').glob('*'))}"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server["url"])
    assert client.get_run(run_id).data.tags["tidal.checkpoint_root_hash"] == manifest["root_hash"]
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).artifact_location.startswith(
        "mlflow-artifacts:")  # proxied: the client never sees s3://
    back = Path(client.download_artifacts(run_id, "", str(tmp_path / "back")))
    assert sha256(back / "params.bin") == manifest["files"][0]["sha256"]
    assert json.loads((back / "checkpoint_manifest.json").read_text()) == manifest

    pages = mlflow_server["s3"].get_paginator("list_objects_v2").paginate(Bucket=mlflow_server["bucket"],
                                                                          Prefix="mlflow/")
    stored = {o["Key"].rsplit("/", 1)[-1]: o["Size"] for p in pages for o in p.get("Contents", [])}
    assert stored["params.bin"] == 20 * 2**20 and stored["checkpoint_manifest.json"] == manifest_path.stat().st_size
