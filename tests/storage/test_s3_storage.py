"""Steps on an s3:// root against a real S3 server (moto, loopback): same step code, marker last."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid

import boto3
import pytest

from tidal.core.runner import StepBlocked, run_step
from tidal.integrity.hashing import verify_manifest
from tidal.steps import Step
from tidal.storage import StorageSettings, open_storage
from tidal.storage.s3 import S3Storage


def raw_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def objects(client, bucket: str, prefix: str = "") -> dict[str, int]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def assert_complete(storage: S3Storage, step_id: str) -> None:
    """Every manifest entry of a committed step exists with its size, and downloads to its sha256."""
    client = raw_client(storage.client.meta.endpoint_url)
    manifest = json.loads(storage.read_text(step_id, "manifest.json"))
    listed = objects(client, storage.bucket, f"{storage.prefix}/{step_id}/")
    for entry in manifest["files"]:
        assert listed.get(f"{storage.prefix}/{step_id}/{entry['path']}") == entry["bytes"], entry["path"]
    assert storage.read_text(step_id, "_SUCCESS").strip() == manifest["root_hash"]
    assert verify_manifest(storage.input_dir(step_id), manifest) == []


def test_open_storage_picks_backend(bucket, tmp_path):
    assert isinstance(open_storage(f"s3://{bucket}/runs/a"), S3Storage)
    assert open_storage("rel", base=tmp_path).root == tmp_path / "rel"
    gcs = open_storage("gs://bucket/x")  # GCS through its S3-interoperable endpoint (docs/how-to/object-storage.md)
    assert isinstance(gcs, S3Storage) and gcs.uri == "gs://bucket/x" and gcs.step_uri("s").startswith("gs://")
    with pytest.raises(Exception, match="scheme not supported"):
        open_storage("ftp://bucket/x")


def test_step_commits_marker_last_and_downstream_reads_a_verified_copy(bucket, proxy, tmp_path):
    storage = open_storage(f"s3://{bucket}/runs/a")
    upstream = Step("writer", "fixture", {"parts": 3, "pause_s": 0.0, "fail_at": None})
    reader = Step("reader", "concat", {}, inputs=(upstream,))
    with pytest.raises(StepBlocked):
        run_step(reader, storage)
    first = run_step(upstream, storage)
    assert first.status == "run" and storage.is_committed(upstream.step_id)
    puts = [path for method, path in proxy.plan.log if method == "PUT" and f"/{upstream.step_id}/" in path]
    assert puts[-1].endswith("/_SUCCESS") and sum(p.endswith("/_SUCCESS") for p in puts) == 1
    assert puts.index(next(p for p in puts if p.endswith("/manifest.json"))) > max(
        puts.index(p) for p in puts if "part-" in p)
    assert_complete(storage, upstream.step_id)
    record = json.loads(storage.read_text(upstream.step_id, "step.json"))
    assert record["provenance"]["storage_root"] == f"s3://{bucket}/runs/a"
    lease = record["provenance"]["lease"]
    assert lease["owner"] and lease["expires_at"] > lease["acquired_at"] and lease["took_over_from"] is None

    other = S3Storage.from_uri(f"s3://{bucket}/runs/a", StorageSettings(cache_dir=str(tmp_path / "other")))
    result = run_step(reader, other)  # a second machine: its own cache, downloads the input
    written = b"".join((storage.step_dir(upstream.step_id) / f"part-{i}.txt").read_bytes() for i in range(3))
    concat = (other.step_dir(reader.step_id) / "concat.txt").read_bytes()
    assert concat == written and written.startswith(b"writer part 0 seed ") and result.summary["files"] == 3
    assert result.summary["sha256"] == hashlib.sha256(written).hexdigest()
    assert run_step(upstream, other).status == "skip" and run_step(reader, storage).status == "skip"


def test_listing_paginates(bucket, proxy):
    storage = open_storage(f"s3://{bucket}/p", settings=StorageSettings(page_size=50))
    step = Step("many", "fixture", {"parts": 230, "pause_s": 0.0, "fail_at": None})
    run_step(step, storage)
    lists_before = sum(1 for m, p in proxy.plan.log if m == "GET" and "list-type=2" in p)
    listed = list(storage.list_objects(f"p/{step.step_id}/"))
    lists = sum(1 for m, p in proxy.plan.log if m == "GET" and "list-type=2" in p) - lists_before
    assert len(listed) == 233 and lists == 5  # 230 parts + manifest, step.json, _SUCCESS; 50 a page
    assert_complete(storage, step.step_id)
    assert len(list(storage.input_dir(step.step_id).glob("part-*.txt"))) == 230


def test_large_file_uploads_in_parts(bucket, proxy):
    settings = StorageSettings(multipart_threshold_bytes=5 << 20, multipart_chunk_bytes=5 << 20)
    storage = open_storage(f"s3://{bucket}/big", settings=settings)
    step = Step("blob", "blob", {"mib": 12})
    run_step(step, storage)
    parts = [p for m, p in proxy.plan.log if m == "PUT" and "partNumber=" in p]
    assert len(parts) == 3 and any(m == "POST" and "uploads" in p for m, p in proxy.plan.log)
    head = raw_client(storage.client.meta.endpoint_url).head_object(Bucket=bucket, Key=f"big/{step.step_id}/blob.bin")
    assert head["ETag"].strip('"').endswith("-3") and head["ContentLength"] == 12 << 20
    assert_complete(storage, step.step_id)


def test_force_rerun_uncommits_marker_first(bucket):
    storage = open_storage(f"s3://{bucket}/f")
    step = Step("writer", "fixture", {"parts": 2, "pause_s": 0.0, "fail_at": None})
    run_step(step, storage)
    assert storage.discard(step.step_id) == storage.step_uri(step.step_id)
    assert not storage.is_committed(step.step_id) and list(storage.list_objects(f"f/{step.step_id}/")) == []
    assert run_step(step, storage, force=True).status == "run"
    assert_complete(storage, step.step_id)


def test_corrupted_object_is_refused_on_download(bucket, tmp_path):
    storage = open_storage(f"s3://{bucket}/c")
    step = Step("writer", "fixture", {"parts": 2, "pause_s": 0.0, "fail_at": None})
    run_step(step, storage)
    raw_client(storage.client.meta.endpoint_url).put_object(
        Bucket=bucket, Key=f"c/{step.step_id}/part-1.txt", Body=b"writer part 1 seed XXXXXXXXXXXXXXXXXXX\n")
    fresh = S3Storage.from_uri(f"s3://{bucket}/c", StorageSettings(cache_dir=str(tmp_path / "fresh")))
    with pytest.raises(Exception, match=r"part-1.txt: .*differs from manifest|part-1.txt: \d+ bytes"):
        fresh.input_dir(step.step_id)
    assert not fresh.step_dir(step.step_id).exists()


def test_storage_settings_change_no_step_id(tiny_data):
    from tests.test_steps import ids

    settings = {"endpoint_url": "https://storage.googleapis.com", "region": "auto", "multipart_chunk_mb": 64,
                "lease_ttl_s": 30.0}
    assert ids(tiny_data) == ids(tiny_data, storage=settings, storage_root="s3://bucket/prefix")


def test_real_clean_step_gives_the_same_bytes_on_both_backends(bucket, tmp_path):
    """The Beam clean kind, unchanged, on an s3:// root and on a local root: same manifest."""
    from tests.data.test_clean import CONFIG
    from tidal.storage import LocalStorage

    raw = Step("fetch-toy", "raw", {})
    clean = Step("clean-toy", "clean", CONFIG, inputs=(raw,))
    s3 = open_storage(f"s3://{bucket}/clean")
    local = LocalStorage(tmp_path / "local")
    for storage in (s3, local):
        for step in (raw, clean):
            assert run_step(step, storage).status == "run"
    assert_complete(s3, clean.step_id)
    manifests = [json.loads(st.read_text(clean.step_id, "manifest.json")) for st in (s3, local)]
    assert manifests[0]["root_hash"] == manifests[1]["root_hash"]
    assert {f["path"] for f in manifests[0]["files"]} >= {"counts.json", "quarantine.parquet"}


def test_pipeline_opens_an_s3_root_with_the_recipe_settings(bucket, tmp_path):
    import yaml

    from tests.conftest import TINY
    from tidal.core.load import load_pipeline

    data = yaml.safe_load(TINY.read_text())
    data["storage"] = {"multipart_chunk_mb": 8, "lease_ttl_s": 30.0}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    pipe = load_pipeline(path, storage_root=f"s3://{bucket}/pipe")
    assert isinstance(pipe.storage, S3Storage) and pipe.storage.uri == f"s3://{bucket}/pipe"
    assert pipe.storage.settings.multipart_chunk_bytes == 8 << 20 and pipe.storage.settings.lease_ttl_s == 30.0
    first = next(iter(pipe.graph))
    assert pipe.status(first.name) == "run" and not first.inputs
    assert pipe.tracking_uri.startswith("sqlite:///") and str(pipe.storage.local_dir) in pipe.tracking_uri


def test_remote_training_prepare_and_commit_on_s3(bucket, proxy, tmp_path):
    """tidal.core.remote around a pod on an s3:// root: everything handed over is a bucket URI, the pod
    seals and stages its outputs, and neither prepare nor commit downloads step data."""
    from tests.conftest import TINY
    from tidal.core.commit import write_commit
    from tidal.core.load import load_pipeline
    from tidal.core.remote import RemoteRunIncomplete, commit, prepare
    from tidal.storage import staging, uris

    pipe = load_pipeline(TINY, storage_root=f"s3://{bucket}/remote")
    train = pipe.graph["train"]
    for dep in train.inputs:  # committed inputs (a tiny file each), as a real commit writes them
        work = pipe.storage.new_scratch(dep.step_id)
        (work / "data.txt").write_text(dep.step_id)
        write_commit(dep, pipe.storage, work, {}, started_at="2026-01-01T00:00:00+00:00", seconds=0.0)
        pipe.storage.commit_scratch(work, dep.step_id)
    shutil.rmtree(pipe.storage.local_dir)  # the Airflow worker that commits is not the one that wrote
    proxy.plan.log.clear()
    prepared = prepare(pipe, "train")
    location = prepared["step_uri"]
    assert prepared["status"] == "run" and location.startswith(f"s3://{bucket}/remote/.staging/{train.step_id}")
    spec = json.loads(uris.read_bytes(uris.join(location, "spec.json")))
    assert spec["step_id"] == train.step_id
    assert all(u.startswith(f"s3://{bucket}/remote/") for u in spec["inputs"].values())  # read in place
    with pytest.raises(RemoteRunIncomplete):
        commit(pipe, "train", started_at=prepared["started_at"], launcher="gke")
    pod = tmp_path / "pod"  # the pod: its own disk, spec from the bucket, outputs sealed and staged
    pod.mkdir()
    (pod / "spec.json").write_bytes(uris.read_bytes(uris.join(location, "spec.json")))
    (pod / "summary.json").write_text(json.dumps({"steps": 1}))
    staging.seal("train", spec["config"], pod, step_id=train.step_id, where="the pod")
    staging.stage(pod, location)
    result = commit(pipe, "train", started_at=prepared["started_at"], launcher="gke", workload="tidal-x")
    assert result.status == "run" and pipe.storage.is_committed(train.step_id)
    gets = [path for method, path in proxy.plan.log if method == "GET" and "list-type" not in path]
    assert not [g for g in gets if "data.txt" in g], gets  # no input data was read by prepare or commit
    assert not [p for p in pipe.storage.local_dir.rglob("*") if p.is_file()]  # nothing landed on this disk
    assert uris.list_sizes(location) == {}  # staging cleared
    assert json.loads(pipe.storage.read_text(train.step_id, "step.json"))["provenance"]["launcher"] == "gke"
    assert_complete(pipe.storage, train.step_id)
    assert prepare(pipe, "train")["status"] == "skip"
    assert commit(pipe, "train", started_at=prepared["started_at"], launcher="gke").status == "skip"


def test_cli_on_an_unreachable_bucket_prints_one_error_line(tmp_path):
    """No credentials for an s3:// root: `tidal plan` exits 1 with one `error:` line, no traceback."""
    import os
    import subprocess
    import sys

    import yaml

    from tests.conftest import TINY

    data = yaml.safe_load(TINY.read_text())
    data["storage_root"] = "s3://tidal-no-such-bucket/prefix"
    recipe = tmp_path / "s3.yaml"
    recipe.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIDAL_S3", "MLFLOW_"))}
    env |= {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_EC2_METADATA_DISABLED": "true"}
    out = subprocess.run([sys.executable, "-m", "tidal.cli", "plan", str(recipe)], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: NoCredentialsError: Unable to locate credentials; ") and "AWS_ACCESS_KEY_ID" in last


def test_the_recipe_endpoint_reaches_inputs_read_in_place(bucket, s3_env, monkeypatch, tmp_path):
    """Only the recipe's storage.endpoint_url names the endpoint (no TIDAL_S3_ENDPOINT_URL): the commit
    (boto3) and the next step's in-place reads (pyarrow.fs, tidal/files/) both reach it."""
    from tests.e2e.slices import write_slice_recipe
    from tidal.core.load import load_pipeline

    monkeypatch.delenv("TIDAL_S3_ENDPOINT_URL")
    recipe = write_slice_recipe(tmp_path / "r.yaml", tmp_path / "unused")
    pipe = load_pipeline(recipe, overrides={"storage.endpoint_url": s3_env.endpoint},
                         storage_root=f"s3://{bucket}/endpoint")
    assert pipe.run("fetch-brown").status == "run"
    shutil.rmtree(pipe.storage.local_dir, ignore_errors=True)  # clean must read fetch's output in the bucket
    result = pipe.run("clean-brown")
    assert result.status == "run" and pipe.storage.is_committed(pipe.graph["clean-brown"].step_id)
    assert not (pipe.storage.local_dir / pipe.graph["fetch-brown"].step_id).exists()  # read in place


def test_a_staged_run_is_committed_only_when_whole(bucket, tmp_path):
    """commit_staged reads the manifest and the listing only: a staged file missing means nothing is
    committed; a whole staging commits once; a second attempt's staging is then a skip, and cleared."""
    from tidal.core.commit import OutputsIncomplete, commit_staged, now
    from tidal.storage import staging, uris

    storage = open_storage(f"s3://{bucket}/staged")
    step = Step("writer", "fixture", {"parts": 2, "pause_s": 0.0, "fail_at": None})

    def staged_run() -> str:
        work = tmp_path / uuid.uuid4().hex
        work.mkdir()
        for i in range(2):
            (work / f"part-{i}.txt").write_text(f"writer part {i}")
        location = staging.new_staging(storage, step.step_id)
        staging.seal(step.kind, dict(step.config), work, step_id=step.step_id, where="the test run")
        staging.stage(work, location)
        return location

    broken = staged_run()
    bucket_name, key = uris.split(uris.join(broken, "part-1.txt"))
    storage.client.delete_object(Bucket=bucket_name, Key=key)
    with pytest.raises(OutputsIncomplete, match="part-1.txt"):
        commit_staged(step, storage, broken, {"parts": 2}, started_at=now(), seconds=0.0)
    assert not storage.is_committed(step.step_id)
    result = commit_staged(step, storage, staged_run(), {"parts": 2}, started_at=now(), seconds=0.0)
    assert result.status == "run" and storage.is_committed(step.step_id)
    assert json.loads(storage.read_text(step.step_id, "step.json"))["summary"] == {"parts": 2}
    again = staged_run()
    assert commit_staged(step, storage, again, {"parts": 2}, started_at=now(), seconds=0.0).status == "skip"
    assert uris.list_sizes(again) == {}


def test_an_input_object_rewritten_after_its_commit_is_refused_by_its_dependent(bucket, s3_env):
    """Issue 43, item 4, on a bucket root: the kinds read inputs in place by range, so the dependent lists
    each input once and compares every object with the manifest by size and by the time the store says it
    was written (LastModified, which no client sets): an object rewritten after the commit's _SUCCESS, or
    one added, is refused at every run, however the bytes were chosen."""
    import time

    from tidal.core.inputs import InputMismatch, verify_inputs

    storage = open_storage(f"s3://{bucket}/t")
    upstream = Step("writer", "fixture", {"parts": 2, "pause_s": 0.0, "fail_at": None})
    reader = Step("reader", "concat", {}, inputs=(upstream,))
    assert run_step(upstream, storage).status == "run"
    assert verify_inputs(reader, storage) == 1
    client = raw_client(s3_env.endpoint)
    key = f"t/{upstream.step_id}/part-0.txt"
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    time.sleep(1.1)  # S3's LastModified has one-second resolution
    client.put_object(Bucket=bucket, Key=key, Body=bytes(reversed(body)))  # same size, other bytes
    with pytest.raises(InputMismatch, match=r"part-0.txt: written after the commit's _SUCCESS"):
        verify_inputs(reader, storage)
    client.put_object(Bucket=bucket, Key=key, Body=body)  # the original bytes again: still not the committed object
    with pytest.raises(InputMismatch, match=r"part-0.txt: written after"):
        run_step(reader, storage)
    client.put_object(Bucket=bucket, Key=f"t/{upstream.step_id}/extra.txt", Body=b"x")
    with pytest.raises(InputMismatch, match=r"extra.txt: not in manifest.json"):
        verify_inputs(reader, storage)
