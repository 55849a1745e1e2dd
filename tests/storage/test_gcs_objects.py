"""gs:// locations through GCS's JSON API (tidal.storage.gcs via tidal.storage.uris) against a real GCS
emulator, fake-gcs-server on loopback: what a sharded checkpoint's commit needs (whole-object writes, create
only if absent, listings with sizes, server-side copies, deletes) and the errors a user sees."""

from __future__ import annotations

import uuid

import pytest

from tests.ports import free_port
from tests.storage.servers import FakeGcsServer
from tidal.storage import uris
from tidal.storage.base import StorageUnreachable


@pytest.fixture(scope="module")
def gcs_server():
    server = FakeGcsServer().start()
    yield server
    server.stop()


@pytest.fixture
def gcs(gcs_server, monkeypatch) -> str:
    """A fresh bucket as a ``gs://`` location, with the settings that point tidal at the emulator."""
    for name, value in gcs_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TIDAL_S3_ENDPOINT_URL", raising=False)
    name = f"objects-{uuid.uuid4().hex[:10]}"
    gcs_server.create_bucket(name)
    return f"gs://{name}/root"


def test_objects_round_trip_through_the_json_api(gcs, gcs_server, tmp_path):
    assert uris.on_gcs(gcs)
    assert uris.write_bytes(uris.join(gcs, "a/one.json"), b"first")
    assert not uris.write_bytes(uris.join(gcs, "a/one.json"), b"second", if_absent=True)  # ifGenerationMatch=0
    assert uris.read_bytes(uris.join(gcs, "a/one.json")) == b"first"
    assert uris.write_bytes(uris.join(gcs, "a/two.json"), b"22", if_absent=True)
    (tmp_path / "d" / "deep").mkdir(parents=True)
    (tmp_path / "d" / "deep" / "x.bin").write_bytes(b"x" * 1000)
    (tmp_path / "d" / "y.bin").write_bytes(b"yy")
    assert uris.upload_dir(tmp_path / "d", uris.join(gcs, "b")) == 1002
    listed = uris.list_objects(gcs)
    assert {name: size for name, (size, _) in listed.items()} == {
        "a/one.json": 5, "a/two.json": 2, "b/deep/x.bin": 1000, "b/y.bin": 2}
    assert all(when > 1.7e9 for _, when in listed.values())  # the store's own times, unix seconds
    uris.copy_dir(uris.join(gcs, "b"), uris.join(gcs, "c"), ["deep/x.bin", "y.bin"])
    bucket = gcs.split("/")[2]
    assert gcs_server.read(bucket, "root/c/deep/x.bin") == b"x" * 1000  # a rewrite inside the store
    uris.delete_object(uris.join(gcs, "a/two.json"))
    uris.delete_object(uris.join(gcs, "a/never-was.json"))  # missing is fine
    uris.delete_dir(uris.join(gcs, "b"))
    assert sorted(uris.list_sizes(gcs)) == ["a/one.json", "c/deep/x.bin", "c/y.bin"]
    with pytest.raises(FileNotFoundError, match="a/two.json does not exist"):
        uris.read_bytes(uris.join(gcs, "a/two.json"))


def test_an_endpoint_that_does_not_answer_names_the_setting(gcs, monkeypatch):
    monkeypatch.setenv("TIDAL_GCS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StorageUnreachable, match="does not answer.*check TIDAL_GCS_ENDPOINT_URL"):
        uris.read_bytes(uris.join(gcs, "a/one.json"))


def test_a_missing_bucket_is_named_on_writes_and_listings(gcs):
    missing = "gs://no-such-bucket-" + uuid.uuid4().hex[:8] + "/root"
    with pytest.raises(StorageUnreachable, match="the bucket does not exist"):
        uris.write_bytes(uris.join(missing, "a.json"), b"{}")
    with pytest.raises(StorageUnreachable, match="the bucket does not exist"):
        uris.list_objects(missing)


def test_an_s3_server_standing_in_for_the_bucket_takes_gs_locations(monkeypatch):
    monkeypatch.setenv("TIDAL_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    assert not uris.on_gcs("gs://b/x") and not uris.on_gcs("s3://b/x")
    monkeypatch.delenv("TIDAL_S3_ENDPOINT_URL")
    assert uris.on_gcs("gs://b/x") and not uris.on_gcs("s3://b/x") and not uris.on_gcs("/tmp/x")
