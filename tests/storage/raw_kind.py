"""A real step kind for storage tests: the toy ``raw.parquet`` of tests/data/test_clean.py (a fetch stand-in)."""

from __future__ import annotations

STEP_VERSION = 1


def run(ctx):
    from tests.data.test_clean import RECORDS, write_raw

    write_raw(ctx.out_dir, RECORDS)
    return {"records": len(RECORDS)}
