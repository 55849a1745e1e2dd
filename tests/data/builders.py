"""Inputs shaped like committed step outputs, for data-step tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_clean_step(
    step_dir: Path, texts: list[str], source: str, counts: dict | None = None, shards: int = 2
) -> Path:
    """A clean-step-shaped directory: ``documents-*.parquet`` (id, text, source; each shard
    sorted by id, id = sha256 of the text, duplicates dropped) and, if given, ``counts.json``."""
    step_dir.mkdir(parents=True)
    rows = sorted({hashlib.sha256(t.encode()).hexdigest(): t for t in texts}.items())
    for index in range(shards):
        part = rows[index::shards]
        table = pa.table(
            {"id": [r[0] for r in part], "text": [r[1] for r in part], "source": [source] * len(part)}
        )
        pq.write_table(table, step_dir / f"documents-{index:05d}-of-{shards:05d}.parquet")
    if counts is not None:
        (step_dir / "counts.json").write_text(json.dumps(counts))
    return step_dir
