"""Spill files of the clean step: the text of a batch's surviving documents, on disk.

A batch's survivors are written once, by the worker that cleaned them, as an uncompressed
Arrow IPC file (``id``, ``text``), and only small stubs (id, ref, source, language, spill
file, row) travel through Beam's shuffles; the writers read the texts back (memory-mapped)
when they need them. So the text does not sit in the runner's in-memory shuffle, and a
worker's memory holds one shard's texts at most, however large the source. Spill files
live in the step's scratch directory (``_spill/``) and are removed before the step commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

SPILL_SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string())])


def write_spill(path: str | Path, ids: Sequence[str], texts: Sequence[str]) -> str:
    """Write ``ids`` and ``texts`` (same length) to ``path`` (atomically: temporary name,
    then rename, so a retried bundle rewrites the same bytes). Returns ``str(path)``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    table = pa.table({"id": list(ids), "text": list(texts)}, schema=SPILL_SCHEMA)
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, SPILL_SCHEMA) as writer:
        writer.write_table(table)
    tmp.replace(path)
    return str(path)


def read_texts(path: str | Path, rows: Sequence[int]) -> list[str]:
    """The texts at ``rows`` of spill file ``path``, in the order of ``rows``.

    Raises:
        FileNotFoundError: if the spill file is gone (the step's scratch was removed).
    """
    with pa.memory_map(str(path), "r") as source:
        column = pa.ipc.open_file(source).read_all().column("text")
        return column.take(pa.array(list(rows), type=pa.int64())).to_pylist()
