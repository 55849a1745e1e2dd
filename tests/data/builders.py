"""Inputs shaped like committed step outputs, for data-step tests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# Words of the synthetic English/Chinese test corpora.
CORPUS_WORDS = ["data", "model", "token", "the", "of", "pipeline", "数据", "模型", "训练", "shard", "seed"]


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


def make_tar(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    """A tar archive (gzip by default) holding ``members`` (name -> bytes), in memory."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_deb(members: dict[str, bytes]) -> bytes:
    """A minimal .deb: ar archive with debian-binary, control.tar.xz and data.tar.xz."""
    parts = [("debian-binary", b"2.0\n"), ("control.tar.xz", make_tar({}, "w:xz")),
             ("data.tar.xz", make_tar(members, "w:xz"))]
    out = [b"!<arch>\n"]
    for name, data in parts:
        header = (name.encode().ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6)
                  + b"100644".ljust(8) + str(len(data)).encode().ljust(10) + b"`\n")
        out += [header, data, b"\n" if len(data) % 2 else b""]
    return b"".join(out)
