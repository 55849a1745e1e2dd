"""Spill files of the clean step: a batch's surviving documents and LSH bucket entries, on disk.

A batch's survivors are written once, by the worker that cleaned them, one uncompressed
Arrow IPC file per shard they go to (``id``, ``ref``, ``source``, ``language``, ``fields``, ``text``:
:data:`SPILL_SCHEMA`); its bucket entries (near-dedup on) one ``.npz`` file
(:func:`write_bands`). Only the paths travel through Beam's shuffles, one element per batch
and shard (or partition), not an element per document (near-dedup candidates' texts are the
exception, :mod:`tidal.data.neardup`): the in-process runner holds every
shuffled collection in memory, several copies of it at once (encoded, partitioned, decoded),
so per-document elements made the clean step's peak memory grow with the corpus. The shard
writers and the near-dedup stages read the files back when they need them (the Arrow files
memory-mapped, the ``.npz`` files one partition's arrays at a time); a shard writer holds its
shard's stubs and one row group's texts.
Spill files live under the job's spill location (:class:`tidal.files.output.OutputDir`): the
step's scratch directory (``_spill/``) on a local root, a prefix beside the attempt's staging
location in the bucket otherwise, so a worker on any machine reads what another wrote; they are
removed before the step commits. Every file is written whole or not at all (renamed into place
locally, one upload to a bucket), so a retried bundle rewrites the same bytes and a reader never
sees half a file. Locally the Arrow files are memory-mapped; from a bucket a reader fetches the byte
ranges of the columns (or the ``.npz`` partition) it needs, never the whole file.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles, is_uri

SPILL_SCHEMA = pa.schema([("id", pa.string()), ("ref", pa.string()), ("source", pa.string()),
                          ("language", pa.string()), ("fields", pa.string()), ("text", pa.string())])
FILE_SCHEMA = SPILL_SCHEMA.append(pa.field("text_bytes", pa.int64()))  # what a spill file holds
STUB_COLUMNS = ("id", "ref", "source", "language", "fields")  # what the shard writer reads before the texts
TEXT_BYTES = "text_bytes"  # a column the file adds: each text's UTF-8 bytes, so stubs never read a text
BATCH_ROWS = 256  # rows per record batch: a reader of some rows' texts fetches only their batches
BAND_ARRAYS = "kmirp"  # a bands file's arrays per partition: keys, members, ids, refs, places


def _open(location: str | Path) -> pa.NativeFile:
    """A spill file for random access: memory-mapped locally; from a bucket, a file that fetches only
    the byte ranges read (:meth:`tidal.files.step_files.StepFiles.open_input`, which counts them)."""
    if not is_uri(location):
        return pa.memory_map(str(location), "r")
    files, name = StepFiles.of_file(location)
    return files.open_input(name)


def docs_path_of(bands_file: str, shard: int) -> str:
    """The spill file of shard ``shard`` written by the batch that wrote ``bands_file``: the clean step names
    a batch's files ``bands-<batch>.npz`` and ``s<shard>-<batch>.arrow`` side by side
    (:class:`tidal.data.clean.fns.CleanBatchFn`)."""
    head, _, name = str(bands_file).rpartition("/")
    if not (name.startswith("bands-") and name.endswith(".npz")):
        raise ValueError(f"{bands_file}: not a bands file (bands-<batch>.npz)")
    return f"{head}/s{shard:05d}-{name[len('bands-'):-len('.npz')]}.arrow"


def write_spill(spill: OutputDir, name: str, columns: dict[str, Sequence[str]]) -> str:
    """Write a batch's documents for one shard as file ``name`` of ``spill``: ``columns`` maps every
    name of :data:`SPILL_SCHEMA` to a sequence of strings (``fields``: or ``None``), all the same
    length. Returns its location.

    Raises:
        KeyError: if a column of :data:`SPILL_SCHEMA` is missing.
    """
    table = pa.table({name: list(columns[name]) for name in SPILL_SCHEMA.names}, schema=SPILL_SCHEMA)
    table = table.append_column(TEXT_BYTES, pc.binary_length(table.column("text")).cast(pa.int64()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=BATCH_ROWS)
    return spill.write_bytes(name, sink.getvalue().to_pybytes())


def read_spill(path: str | Path, columns: Sequence[str] = STUB_COLUMNS) -> pa.Table:
    """``columns`` of the spill file at ``path`` (a local path, memory-mapped: the table keeps the
    mapping open; or a bucket URI): only those columns' buffers are read (the IPC reader's
    ``included_fields``), so the stubs of a file cost their bytes, not its texts'.

    Raises:
        FileNotFoundError: if the spill file is gone (the step's scratch was removed).
    """
    fields = [FILE_SCHEMA.get_field_index(name) for name in columns]
    source = _open(path)
    try:
        table = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(included_fields=fields)).read_all()
    finally:
        if is_uri(path):
            source.close()  # read_all copied the ranges it fetched; a memory map stays open under the table
    return table.select(list(columns))


def read_texts(path: str | Path, rows: Sequence[int]) -> pa.Array:
    """The texts at ``rows`` of spill file ``path``, in the order of ``rows``, as an Arrow
    string array (no Python string per document: callers take, concatenate and write it). Only the
    record batches holding those rows are read, and of them only the text column.

    Raises:
        FileNotFoundError: if the spill file is gone (the step's scratch was removed).
    """
    rows = list(rows)
    if not rows:
        return pa.array([], type=pa.string())
    wanted = sorted({row // BATCH_ROWS for row in rows})
    source = _open(path)
    try:
        reader = pa.ipc.open_file(source, options=pa.ipc.IpcReadOptions(
            included_fields=[FILE_SCHEMA.get_field_index("text")]))
        batches = {b: reader.get_batch(b).column(0) for b in wanted}
    finally:
        if is_uri(path):
            source.close()
    column = pa.chunked_array([batches[b] for b in wanted], type=pa.string())
    starts = dict(zip(wanted, [0, *list(accumulate(len(batches[b]) for b in wanted))[:-1]], strict=True))
    index = [starts[row // BATCH_ROWS] + row % BATCH_ROWS for row in rows]
    return column.take(pa.array(index, type=pa.int64())).combine_chunks()


def write_bands(spill: OutputDir, name: str, entries: dict[int, tuple[np.ndarray, ...]]) -> str:
    """Write a batch's LSH bucket entries (:func:`tidal.data.neardup.band_entries`: ``{partition:
    (keys uint64[m], members int32[m], ids uint8[k, 32], refs str[k], places int32[k, 2])}``) to one
    uncompressed ``.npz`` file ``name`` of ``spill``. Returns its location."""
    arrays = {}
    for partition, entry in entries.items():
        for letter, array in zip(BAND_ARRAYS, entry, strict=True):
            arrays[f"{letter}{partition}"] = array
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return spill.write_bytes(name, buffer.getvalue())


def read_bands(path: str | Path, partition: int) -> tuple[np.ndarray, ...]:
    """One partition's ``(keys, members, ids, refs, places)`` from a :func:`write_bands` file (only those
    five arrays are read).

    Raises:
        FileNotFoundError: if the file is gone; KeyError: if it holds no entry of ``partition``.
    """
    if not is_uri(path):
        with np.load(str(path)) as npz:
            return tuple(npz[f"{letter}{partition}"] for letter in BAND_ARRAYS)
    # from a bucket: the zip directory and this partition's members, by byte range, not the file
    with _open(path) as source, np.load(source) as npz:
        return tuple(npz[f"{letter}{partition}"] for letter in BAND_ARRAYS)
