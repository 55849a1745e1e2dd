"""A storage root that cannot be used is one ``error:`` line naming the setting, exit 1, nothing committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import boto3
import pytest

from tests.conftest import REPO, TINY
from tests.storage.servers import free_port


def _tidal(args: list[str], env: dict[str, str], cwd) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TIDAL_S3", "TIDAL_STORAGE"))}
    return subprocess.run([sys.executable, "-m", "tidal.cli", *args], check=False, capture_output=True, text=True,
                          timeout=300,
                          cwd=cwd, env={**base, "PYTHONPATH": str(REPO), **env})


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


def test_a_root_of_an_unknown_scheme_names_the_setting(tmp_path):
    proc = _tidal(["plan", str(TINY)], {"TIDAL_STORAGE_ROOT": "ftp://bucket/tidal"}, tmp_path)
    line = _one_error_line(proc)
    assert "ftp://bucket/tidal" in line and "s3://" in line and "gs://" in line


def test_an_unreachable_endpoint_names_the_setting(tmp_path):
    env = {"TIDAL_STORAGE_ROOT": "s3://tidal/root", "TIDAL_S3_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_MAX_ATTEMPTS": "1"}
    line = _one_error_line(_tidal(["run", str(TINY), "--step", "fetch-brown"], env, tmp_path))
    assert "TIDAL_S3_ENDPOINT_URL" in line


@pytest.mark.usefixtures("moto_server")
def test_missing_credentials_and_a_missing_bucket_name_the_setting(moto_server, tmp_path):
    boto3.client("s3", endpoint_url=moto_server.endpoint, region_name="us-east-1", aws_access_key_id="t",
                 aws_secret_access_key="t").create_bucket(Bucket="exists")
    no_keys = {"TIDAL_STORAGE_ROOT": "s3://exists/root", "TIDAL_S3_ENDPOINT_URL": moto_server.endpoint,
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": str(tmp_path / "none"),
               "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true"}
    line = _one_error_line(_tidal(["run", str(TINY), "--step", "fetch-brown"], no_keys, tmp_path))
    assert "AWS_ACCESS_KEY_ID" in line
    missing = {**no_keys, "TIDAL_STORAGE_ROOT": "s3://no-such-bucket/root", "AWS_ACCESS_KEY_ID": "t",
               "AWS_SECRET_ACCESS_KEY": "t"}
    line = _one_error_line(_tidal(["run", str(TINY), "--step", "fetch-brown"], missing, tmp_path))
    assert "TIDAL_STORAGE_ROOT" in line


@pytest.mark.parametrize("endpoint", ["127.0.0.1:5055", "http://127.0.0.1:5055/bucket", "htp://x"])
def test_a_malformed_endpoint_is_refused_before_any_request(tmp_path, endpoint):
    proc = _tidal(["plan", str(TINY)], {"TIDAL_STORAGE_ROOT": "s3://tidal/root", "TIDAL_S3_ENDPOINT_URL": endpoint},
                  tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "TIDAL_S3_ENDPOINT_URL" in errors[0], proc.stderr[-2000:]


@pytest.mark.parametrize("root", ["file://host/x", "file:relative"])
def test_a_file_uri_with_a_host_is_refused(tmp_path, root):
    line = _one_error_line(_tidal(["plan", str(TINY)], {"TIDAL_STORAGE_ROOT": root}, tmp_path))
    assert "file:///abs/path" in line


def test_a_job_never_writes_a_committed_prefix(tmp_path):
    """A bucket --out must be a staging location (only the commit task writes {root}/{step_id}/)."""
    config = json.dumps({"source": "brown", "input": "fetch-brown"})  # valid: the --out rule is what is refused
    proc = subprocess.run([sys.executable, "-m", "tidal.data.clean", "--config", config, "--input", "fetch-brown=s3://b/r/f/",
                           "--out", "s3://b/r/fetch-brown-7aa5e54f3d11/"], check=False, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2 and "staging location" in proc.stderr.splitlines()[-1], proc.stderr[-2000:]


def test_plan_on_a_missing_bucket_says_so(moto_server, tmp_path):
    env = {"TIDAL_STORAGE_ROOT": "s3://no-such-bucket/root", "TIDAL_S3_ENDPOINT_URL": moto_server.endpoint,
           "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}
    line = _one_error_line(_tidal(["plan", str(TINY)], env, tmp_path))
    assert "no-such-bucket" in line and "does not exist" in line and "TIDAL_STORAGE_ROOT" in line


def test_a_bad_storage_root_in_the_recipe_names_the_file_and_field(tmp_path):
    import yaml

    data = yaml.safe_load(TINY.read_text())
    data["storage_root"] = "ftp://bucket/x"
    recipe = tmp_path / "bad-root.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = _tidal(["plan", str(recipe)], {}, tmp_path)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert str(recipe) in errors[0] and "storage_root" in errors[0] and "ftp://bucket/x" in errors[0]
