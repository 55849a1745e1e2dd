"""No spurious warnings in a normal run (issue 44): Beam's warning about its unused optional BigQuery client is
dropped in every process that imports tidal, and other root-logger warnings still come through."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import logging
logging.basicConfig()
import tidal.data.clean.step  # imports Beam
logging.warning("a real warning")
"""


def test_beams_apitools_warning_is_dropped_and_others_are_not():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    assert "apitools not found" not in out.stderr, out.stderr
    assert "WARNING:root:a real warning" in out.stderr
    probe = "import logging; logging.basicConfig(); import apache_beam.io.gcp.internal.clients.bigquery"
    bare = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert "apitools not found" in bare.stderr  # what the filter is for, seen without tidal
