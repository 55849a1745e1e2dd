"""tidal/settings.py: the one settings object for tidal's environment."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REPO
from tidal import settings
from tidal.cli import main


def test_settings_read_typed_values_and_name_a_malformed_variable(monkeypatch):
    monkeypatch.setenv("TIDAL_STATSD_PORT", "9125")
    monkeypatch.setenv("TIDAL_SIGNING_KEY", "ab" * 32)
    read = settings.read()
    assert read.statsd_port == 9125 and "ab" * 32 not in repr(read)  # a secret never prints
    monkeypatch.setenv("TIDAL_STATSD_PORT", "not-a-port")
    with pytest.raises(settings.SettingsError, match=r"TIDAL_STATSD_PORT: .*integer.*'not-a-port'"):
        settings.read()


def test_an_entry_point_reads_once_and_children_get_its_settings_explicitly(monkeypatch):
    monkeypatch.setenv("TIDAL_STORAGE_ROOT", "/first")
    with settings.entry_point() as active:
        monkeypatch.setenv("TIDAL_STORAGE_ROOT", "/changed-meanwhile")
        assert settings.current() is active and settings.current().storage_root == "/first"
        assert active.child_env()["TIDAL_STORAGE_ROOT"] == "/first"
    assert settings.current().storage_root == "/changed-meanwhile"  # outside: read at the call


def test_the_cli_refuses_a_malformed_variable_with_one_error_line(monkeypatch, capsys):
    monkeypatch.setenv("TIDAL_TRACKING_FLUSH_TIMEOUT_S", "-1")
    assert main(["plan", str(REPO / "recipes" / "tiny.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: environment: TIDAL_TRACKING_FLUSH_TIMEOUT_S: Input should be greater than 0 (got '-1')"]


def test_no_tidal_module_reads_its_configuration_from_os_environ():
    """Only the listed places touch os.environ: other programs' variables, or writing a child's."""
    allowed = {
        "tidal/settings.py", "tidal/quality/gates.py", "tidal/train/distributed.py", "tidal/data/tokenizer.py",
        "tidal/data/jobcli.py", "tidal/tracking/tracker.py", "tidal/tracking/client.py", "tidal/train/metrics.py",
        "tidal/core/pipeline.py",
        "tidal/launch/local.py", "tidal/eval/step.py",
        "tidal/storage/gcs.py",  # Google's GOOGLE_APPLICATION_CREDENTIALS; TensorStore's endpoint, written
        "tidal/train/sizing.py",  # the sizer's env: this one's, with libtpu on PYTHONPATH and without JAX_PLATFORMS
    }
    out = subprocess.run(["git", "grep", "-l", "-E", r"os\.environ|getenv\(", "--", "tidal"], cwd=REPO,
                         capture_output=True, text=True, check=False)
    readers = set(out.stdout.split())
    assert readers <= allowed, sorted(readers - allowed)
    # what they do there is write (setdefault, update, a child's env) or read another program's variable
    for path in readers - {"tidal/settings.py"}:
        text = (REPO / path).read_text()
        assert not re.search(r'os\.environ\.get\("TIDAL_', text), path
