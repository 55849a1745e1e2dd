"""A worker process for storage tests: ``python -m tests.storage.worker JSON``.

JSON: ``{"root", "step": {"name", "kind", "config"}, "settings": {...}, "go": FILE|null,
"out": FILE}``. It waits for ``go`` to exist (so several workers start together), runs the
step with :func:`tidal.core.runner.run_step` and writes ``{"status", "pid"}`` to ``out``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tidal.core.runner import run_step
from tidal.kinds import KINDS, KindSpec
from tidal.steps import Step
from tidal.storage import StorageSettings, open_storage


def main(spec: dict) -> None:
    KINDS["fixture"] = KindSpec("tests.fixture_kind", 1)
    KINDS["blob"] = KindSpec("tests.storage.blob_kind", 1)
    storage = open_storage(spec["root"], settings=StorageSettings(**spec.get("settings", {})))
    step = Step(spec["step"]["name"], spec["step"]["kind"], spec["step"]["config"])
    if spec.get("go"):
        deadline = time.monotonic() + 60
        while not Path(spec["go"]).exists() and time.monotonic() < deadline:
            time.sleep(0.005)
    result = run_step(step, storage)
    Path(spec["out"]).write_text(json.dumps({"status": result.status, "pid": os.getpid()}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
