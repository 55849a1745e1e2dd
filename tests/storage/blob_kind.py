"""A real step kind for storage tests: one file of ``mib`` MiB of seeded pseudo-random bytes."""

from __future__ import annotations

import numpy as np

STEP_VERSION = 1


def run(ctx):
    data = np.random.default_rng(ctx.seed).integers(0, 256, ctx.config["mib"] << 20, dtype=np.uint8).tobytes()
    (ctx.out_dir / "blob.bin").write_bytes(data)
    return {"bytes": len(data)}
