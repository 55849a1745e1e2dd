"""Issue 22, item 10: a full disk is one line naming the step and the directory, and leaves no copy.

The storage root is a 24 MiB tmpfs mounted in a private mount namespace (``unshare -m``), filled with
ballast until about 1 MiB is free; a real Beam step (tests/fixture_beam_kind.py, WriteToText on the
in-process runner) then writes 8 MiB into it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = r"""
import json, os, sys
from pathlib import Path
from tidal.kinds import KINDS, KindSpec
KINDS["beamwriter"] = KindSpec("tests.fixture_beam_kind", 1, beam=True)
from tidal.core.runner import run_step
from tidal.steps import Step
from tidal.storage import LocalStorage
root = Path(sys.argv[1])
storage = LocalStorage(root / "root")
(root / "root").mkdir()
with open(root / "ballast", "wb") as f:  # leave about 1 MiB free
    free = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
    f.write(b"\0" * (free - (1 << 20)))
step = Step("writer", "beamwriter", {"records": 8192, "bytes": 1024})
out = {}
for attempt in range(2):  # a retry on the same full disk fails the same way and keeps nothing either
    try:
        run_step(step, storage)
        out["result"] = "committed"
    except Exception as err:
        out[f"error{attempt}"] = [type(err).__name__, str(err)]
out["failed"] = storage.failed_attempts(step.step_id)
out["committed"] = storage.is_committed(step.step_id)
out["left"] = sorted(str(p.relative_to(root)) for p in (root / "root").rglob("*") if p.is_file())
st = os.statvfs(root)
out["free_mib"] = st.f_bavail * st.f_frsize / 2**20
print("OUT", json.dumps(out))
"""


def test_a_full_disk_is_one_line_and_keeps_no_copy_of_the_attempt(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a private mount namespace for the tmpfs)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(SCRIPT)
    cmd = f"mount -t tmpfs -o size=24m tmpfs {mnt} && cd {REPO} && exec {sys.executable} {script} {mnt}"
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("OUT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[0][4:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # Beam's logged copy of the error is silenced
    for attempt in ("error0", "error1"):
        kind, message = out[attempt]
        assert kind == "DiskFull", out[attempt]
        assert "\n" not in message and "no space left on device under" in message and "writer-" in message, message
        assert "MiB free of" in message
    assert not out["committed"] and out["failed"] == [], out
    assert not any(p.startswith(("root/.failed", "root/.scratch")) for p in out["left"]), out["left"]
    assert out["free_mib"] > 0.5, out  # the partial attempt was removed, its space given back
