"""Dataflow-ready: the clean and tokenize pipelines, built with DataflowRunner options for a staged
run, hold no local path anywhere in their runner API proto (what Dataflow would be sent; nothing is
submitted), and the job's temp and staging locations default to the attempt's prefix in the bucket."""

from __future__ import annotations

import base64
import bz2
import contextlib
import os
import re
import sys
import zlib
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, SetupOptions, WorkerOptions
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.transforms.environments import DockerEnvironment, python_sdk_dependencies

from tests.data.test_clean_in_place import CONFIG, fetch_step
from tests.data.test_stream_edge_cases import tokenizer_dir  # noqa: F401 - fixture used here
from tests.files.conftest import upload  # noqa: F401 - fixture used here
from tests.storage.conftest import bucket, moto_server, s3_env  # noqa: F401 - fixtures used by upload
from tidal.context import StepContext
from tidal.data import clean, tokenize
from tidal.data import tokenizer as tokenizer_step
from tidal.data.beam_options import beam_args, staged_defaults
from tidal.data.shards import DOCUMENTS_PREFIX, shard_names
from tidal.files.step_files import StepFiles
from tidal.storage import staging

IMAGE = "europe-docker.pkg.dev/tidal/tidal/beam-worker:abc123"


def gs(uri: str) -> str:
    """The moto bucket as a ``gs://`` root (GCS through its S3-interoperable API: here moto's endpoint,
    ``TIDAL_S3_ENDPOINT_URL``), since Dataflow accepts only ``gs://`` temp and staging locations."""
    return "gs://" + uri.removeprefix("s3://")


def dataflow_options(work_uri: str, monkeypatch) -> PipelineOptions:
    monkeypatch.setenv("TIDAL_BEAM_WORKER_IMAGE", IMAGE)
    monkeypatch.delenv("TIDAL_BEAM_ARGS", raising=False)
    # --dry_run: Beam validates the options without asking GCS whether the temp bucket has a soft-delete policy
    # (its gcsio is importable since google-cloud-storage is installed, and GCS is not reachable from here)
    extra = ["--runner=DataflowRunner", "--project=tidal-prod", "--region=europe-west4", "--dry_run=True"]
    return PipelineOptions(beam_args([*staged_defaults(work_uri, extra), *extra]))


def local_paths(proto_bytes: bytes, tmp_path: Path) -> list[str]:
    """Local paths of this machine that start a string in the serialized pipeline (pickled DoFns
    included): not preceded by a name character, so ``gs://bucket/root/…`` is not the home ``/root``."""
    candidates = {str(tmp_path), os.getcwd(), str(Path.home()), sys.prefix, "/tmp/", "/var/tmp/", "file://"}
    return sorted(c for c in candidates if re.search(rb"(?<![A-Za-z0-9._-])" + re.escape(c.encode()), proto_bytes))


def proto_of(pipeline: beam.Pipeline, options: PipelineOptions) -> bytes:
    """The pipeline proto with the environment DataflowRunner gives it (its apiclient: the worker
    image, plus the Python dependencies the stager would upload: none with the image's own SDK),
    serialized, followed by every ParDo's pickled DoFn decoded (Beam base64-encodes, and may
    bz2- or zlib-compress, the pickles, so their strings are not visible in the proto's bytes)."""
    environment = DockerEnvironment.from_container_image(options.view_as(WorkerOptions).sdk_container_image,
                                                         artifacts=python_sdk_dependencies(options))
    proto = pipeline.to_runner_api(default_environment=environment)
    decoded = []
    for transform in proto.components.transforms.values():
        if transform.spec.urn == common_urns.primitives.PAR_DO.urn:
            pardo = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            payload = base64.b64decode(pardo.do_fn.payload)
            if payload.startswith(b"BZh"):  # Beam 2.77's pickler: bz2
                payload = bz2.decompress(payload)
            else:
                with contextlib.suppress(zlib.error):
                    payload = zlib.decompress(payload)
            decoded.append(payload)
    assert decoded, "no ParDo in the pipeline"
    return proto.SerializeToString() + b"".join(decoded)


def test_staged_defaults_put_temp_and_staging_under_the_attempt(monkeypatch):
    work = "gs://tidal-prod/runs/.staging/clean-web-0123456789ab.20261202T000000.abcd1234.job/"
    options = dataflow_options(work, monkeypatch)
    gcp = options.view_as(GoogleCloudOptions)
    assert gcp.temp_location == work + "beam-temp" and gcp.staging_location == work + "beam-staging"
    assert options.view_as(WorkerOptions).sdk_container_image == IMAGE
    assert options.view_as(SetupOptions).save_main_session is False  # tidal is installed in the image
    given = staged_defaults(work, ["--temp_location=gs://other/tmp"])
    assert not any(a.startswith("--temp_location") for a in given)


def test_clean_pipeline_for_dataflow_holds_no_local_path(tmp_path, monkeypatch, upload, s3_env):  # noqa: F811
    step_dir = fetch_step(tmp_path, monkeypatch)
    raw = gs(upload(step_dir, "fetch-web-0123456789ab")) + "raw.parquet"
    location = f"gs://{upload.bucket}/root/.staging/clean-web-1.20261202T000000.abcd1234/"
    ctx = StepContext("clean-web-1", "clean-web", "clean", CONFIG, tmp_path / "unused", {"fetch-web": raw},
                      out_uri=location, work_uri=staging.job_location(location))
    options = dataflow_options(ctx.work_uri, monkeypatch)
    pipeline = beam.Pipeline(options=options)
    clean.build_pipeline(pipeline, raw, ctx.output(), clean.CleanConfig.model_validate(CONFIG), ctx.spill())
    proto = proto_of(pipeline, options)
    assert location.rstrip("/").encode() in proto and IMAGE.encode() in proto  # the proto is what we think it is
    assert local_paths(proto, tmp_path) == []


def test_tokenize_pipeline_for_dataflow_holds_no_local_path(tmp_path, monkeypatch, upload, s3_env,  # noqa: F811
                                                           tokenizer_dir):  # noqa: F811
    from tests.data.builders import CORPUS_WORDS, write_clean_step

    texts = [" ".join(CORPUS_WORDS[(i * 3 + j) % len(CORPUS_WORDS)] for j in range(4 + i % 9)) for i in range(40)]
    documents = StepFiles.open(gs(upload(write_clean_step(tmp_path / "clean-syn", texts, "syn"), "clean-syn-0123")))
    tok_uri = gs(upload(tokenizer_dir, "tokenizer-0123"))
    tokenizer, meta = tokenizer_step.load(StepFiles.open(tok_uri))
    paths = [documents.uri_of(n) for n in shard_names(documents, DOCUMENTS_PREFIX, "parquet")]
    location = f"gs://{upload.bucket}/root/.staging/tokenize-syn-1.20261202T000000.abcd1234/"
    config = {"source": "syn", "input": "clean-syn", "tokenizer": "tokenizer", "seq_len": 8, "shards": 2}
    ctx = StepContext("tokenize-syn-1", "tokenize-syn", "tokenize", config, tmp_path / "unused", {},
                      out_uri=location, work_uri=staging.job_location(location))
    options = dataflow_options(ctx.work_uri, monkeypatch)
    pipeline = beam.Pipeline(options=options)
    settings = {"seq_len": 8, "shards": 2, "vocab_size": meta["vocab_size"], "tokenizer_hash": meta["tokenizer_hash"]}
    tokenize.build_pipeline(pipeline, paths, tok_uri, meta["eos_id"], tokenize.special_token_ids(tokenizer),
                            settings, ctx.output(), ctx.spill())
    proto = proto_of(pipeline, options)
    assert location.rstrip("/").encode() in proto and tok_uri.encode() in proto
    assert local_paths(proto, tmp_path) == []

