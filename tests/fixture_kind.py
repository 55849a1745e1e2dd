"""A small real step kind for commit-protocol tests: writes ``part-*.txt`` files slowly.

Config: ``{"parts": int, "pause_s": float, "fail_at": int | None}``. The environment
variable ``TIDAL_FIXTURE_FAIL_AT`` injects a fault without changing the step id (a fault
in the environment, not in what the step computes).
"""

from __future__ import annotations

import os
import time

STEP_VERSION = 1


def run(ctx):
    for i in range(ctx.config["parts"]):
        if ctx.config.get("fail_at") == i or os.environ.get("TIDAL_FIXTURE_FAIL_AT") == str(i):
            raise RuntimeError(f"injected failure at part {i}")
        (ctx.out_dir / f"part-{i}.txt").write_text(f"{ctx.name} part {i} seed {ctx.seed}\n")
        time.sleep(ctx.config.get("pause_s", 0.0))
    return {"parts": ctx.config["parts"]}
