"""The Beam jobs with a bucket staging location: workers write outputs and spill files to the bucket.

What a Flink TaskManager or a Dataflow worker does on its own machine is what the in-process runner
does here with ``StepContext.out_uri``: every output object is uploaded by the worker that made it
(with its checksum record), spill files live under the attempt's ``….job/spill/`` and are gone when
the job ends, and the manifest :func:`tidal.storage.staging.seal_staged` builds from the listing and
the records is byte-identical to the one a local run writes over the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data.test_clean_in_place import CONFIG, fetch_step, files_of
from tests.data.test_stream_edge_cases import tokenizer_dir  # noqa: F401 - fixture used here
from tests.files.conftest import upload  # noqa: F401 - fixture used here
from tests.storage.conftest import bucket, moto_server, s3_env  # noqa: F401 - fixtures used by upload
from tidal.context import CHECKSUMS, SPILL_PREFIX, StepContext
from tidal.data import clean, jobcli, tokenize
from tidal.integrity.hashing import build_manifest
from tidal.kinds import kind_spec
from tidal.storage import staging, uris
from tidal.storage.layout import MANIFEST_JSON


def listed(client, bucket_name: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``s3://bucket/prefix/`` -> its bytes."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket_name, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix) + 1:]] = client.get_object(Bucket=bucket_name, Key=obj["Key"])["Body"].read()
    return out


def staged_context(kind: str, name: str, config: dict, inputs: dict, location: str, tmp_path: Path) -> StepContext:
    scratch = tmp_path / "unused-local-out"
    return StepContext(f"{name}-t", name, kind, config, scratch, inputs, out_uri=location,
                       work_uri=staging.job_location(location))


def check_staged(kind: str, config: dict, location: str, local_dir: Path, upload, summary: dict) -> None:  # noqa: F811
    """The workers' spill files are in the bucket; after the launcher's seal (spill deleted, manifest
    from the checksum records, summary) the staged objects are the local run's files and the
    manifest is the local one's."""
    work = staging.job_location(location)
    work_key = work.split("/", 3)[3].rstrip("/")
    assert any(n.startswith(f"{SPILL_PREFIX}/") for n in listed(upload.client, upload.bucket, work_key))
    jobcli._seal_in_place(kind, kind_spec(kind).parse_config(config), location, summary, f"{kind}-t")
    objects = listed(upload.client, upload.bucket, location.split("/", 3)[3].rstrip("/"))
    want = files_of(local_dir)
    assert {n: b for n, b in objects.items() if n != MANIFEST_JSON} == want
    manifest = build_manifest(local_dir)
    assert json.loads(objects[MANIFEST_JSON]) == manifest
    work_objects = listed(upload.client, upload.bucket, work_key)
    assert sorted(work_objects) == sorted([staging.SUMMARY_FILE, *(f"{CHECKSUMS}/{n}.json" for n in want)])
    assert json.loads(work_objects[staging.SUMMARY_FILE]) == summary
    assert not (local_dir.parent / "unused-local-out").exists()


def test_clean_workers_write_the_local_bytes_to_the_staging_location(tmp_path, monkeypatch, upload, s3_env):  # noqa: F811
    monkeypatch.delenv("TIDAL_BEAM_ARGS", raising=False)
    step_dir = fetch_step(tmp_path, monkeypatch)
    local = tmp_path / "local"
    local.mkdir()
    want = clean.run(StepContext("clean-web-1", "clean-web", "clean", CONFIG, local, {"fetch-web": step_dir}))
    uri = upload(step_dir, "fetch-web-0123456789ab")
    location = f"s3://{upload.bucket}/root/.staging/clean-web-1.20261202T000000.abcd1234/"
    summary = clean.run(staged_context("clean", "clean-web", CONFIG, {"fetch-web": uri}, location, tmp_path))
    assert summary == want and want["duplicates_near"] == 2
    check_staged("clean", CONFIG, location, local, upload, summary)


def test_tokenize_workers_write_the_local_bytes_to_the_staging_location(tmp_path, monkeypatch, upload, s3_env,  # noqa: F811
                                                                       tokenizer_dir):  # noqa: F811
    monkeypatch.delenv("TIDAL_BEAM_ARGS", raising=False)
    from tests.data.builders import CORPUS_WORDS, write_clean_step

    texts = [" ".join(CORPUS_WORDS[(i * 7 + j) % len(CORPUS_WORDS)] for j in range(3 + i % 20)) for i in range(120)]
    clean_dir = write_clean_step(tmp_path / "clean-syn", texts, "syn", shards=3)
    config = {"source": "syn", "input": "clean-syn", "tokenizer": "tokenizer", "seq_len": 8, "shards": 2}
    local = tmp_path / "local"
    local.mkdir()
    want = tokenize.run(StepContext("tokenize-t", "tokenize-syn", "tokenize", config, local,
                                    {"clean-syn": clean_dir, "tokenizer": tokenizer_dir}))
    inputs = {"clean-syn": upload(clean_dir, "clean-syn-0123456789ab"), "tokenizer": upload(tokenizer_dir, "tok-0123")}
    location = f"s3://{upload.bucket}/root/.staging/tokenize-syn-t.20261202T000000.abcd1234/"
    summary = tokenize.run(staged_context("tokenize", "tokenize-syn", config, inputs, location, tmp_path))
    assert summary == want and want["n_sequences"] > 0
    check_staged("tokenize", config, location, local, upload, summary)


def test_an_output_without_its_checksum_record_is_not_sealed(tmp_path, monkeypatch, upload, s3_env):  # noqa: F811
    """A stray object in the staging location (or a writer that died between its upload and its record)
    is refused by name: the manifest is only ever built from what the workers recorded."""
    monkeypatch.delenv("TIDAL_BEAM_ARGS", raising=False)
    step_dir = fetch_step(tmp_path, monkeypatch)
    uri = upload(step_dir, "fetch-web-0123456789ab")
    location = f"s3://{upload.bucket}/root/.staging/clean-web-1.20261202T000000.ffff0000/"
    clean.run(staged_context("clean", "clean-web", CONFIG, {"fetch-web": uri}, location, tmp_path))
    uris.write_bytes(uris.join(location, "stray.txt"), b"not written by a worker")
    with pytest.raises(staging.StagedIncomplete, match=r"no checksum record \['stray.txt'\]"):
        staging.seal_staged("clean", kind_spec("clean").parse_config(CONFIG), location, step_id="clean-web-1",
                            where="the test job")


def test_spill_files_in_the_bucket_are_read_by_the_ranges_a_stage_needs(tmp_path, upload, s3_env):  # noqa: F811
    """Issue 38, item 4: the stubs of a spill file cost their columns' bytes, not the texts'; some rows'
    texts cost their record batch's text column; one LSH partition of a bands file costs that
    partition's arrays, not the file."""
    import numpy as np

    from tidal.data.neardup import NearDupConfig, band_entries
    from tidal.data.spill import read_bands, read_spill, read_texts, write_bands, write_spill
    from tidal.files.output import OutputDir
    from tidal.files.step_files import StepFiles, bytes_fetched

    spill = OutputDir(f"s3://{upload.bucket}/root/.staging/x.job/spill/")
    texts = [" ".join(f"word{(i * 7 + k) % 997}" for k in range(400)) for i in range(300)]
    ids = [f"{i:064x}" for i in range(300)]
    path = write_spill(spill, "s.arrow", {"id": ids, "ref": [f"r:{i}" for i in range(300)], "source": ["t"] * 300,
                                          "language": ["en"] * 300, "fields": [None] * 300, "text": texts})
    size = StepFiles.open(spill.location).size("s.arrow")
    before = bytes_fetched()
    stubs = read_spill(path)
    fetched = bytes_fetched() - before
    assert stubs.column("id").to_pylist() == ids and "text" not in stubs.column_names
    assert fetched < size / 10, (fetched, size)  # the texts are ~97% of the file
    assert read_texts(path, [5, 2]).to_pylist() == [texts[5], texts[2]]
    before = bytes_fetched()
    assert read_texts(path, [290, 260, 299]).to_pylist() == [texts[290], texts[260], texts[299]]
    assert bytes_fetched() - before < size / 4  # the record batch of rows 256-299 only

    entries = band_entries([(doc_id, f"r:{i}", text, 0, i) for i, (doc_id, text) in enumerate(zip(ids, texts,
                                                                                                   strict=True))],
                           NearDupConfig(enabled=True), partitions=16)
    bands = write_bands(spill, "b.npz", entries)
    size = StepFiles.open(spill.location).size("b.npz")
    before = bytes_fetched()
    keys, members, got_ids, refs, places = read_bands(bands, 3)
    fetched = bytes_fetched() - before
    assert np.array_equal(keys, entries[3][0]) and refs.tolist() == entries[3][3].tolist()
    assert np.array_equal(members, entries[3][1]) and np.array_equal(got_ids, entries[3][2])
    assert np.array_equal(places, entries[3][4])
    assert fetched < size / 4, (fetched, size)  # one of 16 partitions (and the zip directory)
