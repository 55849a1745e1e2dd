"""Review of the clean step's spill-file shuffles: determinism across runners, spill files
written by concurrent attempts of one bundle, and the shard writer's memory per document."""

from __future__ import annotations

import hashlib
import random
import threading
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tidal.data import clean, fetch, spill
from tidal.data.clean.fns import dedup_shard, read_stubs
from tidal.files.output import OutputDir

ONE_WORKER = ["--runner=FnApiRunner", "--direct_num_workers=1"]
PROCESSES = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
WORDS = ["river", "mill", "grain", "market", "bridge", "stone", "summer", "merchant", "wool", "silver", "timber",
         "amber", "honey", "leather", "harbour", "lantern", "orchard", "meadow", "valley", "forest", "the", "and",
         "of", "with", "that", "to", "have", "be", "copper", "glass", "salt", "horses"]
CONFIG = {"source": "toy", "input": "fetch-toy", "normalization": "NFC", "min_chars": 20, "max_chars": 5_000_000,
          "min_letter_fraction": 0.5, "shards": 7, "near_dedup": {"enabled": True}}


def document(i: int) -> str:
    rng = random.Random(i)
    return "\n".join(" ".join(rng.sample(WORDS, 12)).capitalize() + "." for _ in range(16))


def near_copy(i: int) -> str:
    lines = document(i).split("\n")
    lines[1] = "Changed " + lines[1].split(" ", 1)[1]
    return "\n".join(lines)


def records(n: int = 1200) -> list[tuple[str, bytes]]:
    """~1.5 MB over several 1 MB batches: exact copies far apart, near duplicates with an exact
    copy each in another batch, one record over BATCH_BYTES, a quarantined and a filtered one."""
    recs = [(f"w:{i}", document(i).encode()) for i in range(n)]
    recs += [(f"w:{n + i}", document(i).encode()) for i in range(0, n, 97)]
    for i in range(0, n, 131):
        recs += [(f"n:{i}", near_copy(i).encode()), (f"n:{i + 100000}", near_copy(i).encode())]
    recs += [("big:1", (document(5) + "\n").encode() * 1500), ("q:1", b"bad \x92 utf8 " * 5), ("f:1", b"short")]
    random.Random(0).shuffle(recs)
    return recs


def run_clean(root: Path, recs, args: list[str]) -> tuple[dict, Path]:
    raw = root / "fetch-toy" / "raw.parquet"
    raw.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"source": ["toy"] * len(recs), "ref": [r for r, _ in recs],
                      "raw": pa.array([b for _, b in recs], pa.binary())}, schema=fetch.RAW_SCHEMA)
    pq.write_table(table, raw, row_group_size=400)  # several slices: work for both workers
    out = root / "out"
    return clean.clean(raw, out, clean.CleanConfig.model_validate(CONFIG), args=args), out


def test_one_worker_and_two_processes_write_the_same_bytes(tmp_path):
    """Passes: exact copies in other batches and shards, near duplicates with exact copies,
    a record over BATCH_BYTES, 7 shards: every file byte-identical across running modes, the
    counts reconcile and every duplicate's cluster is a kept document."""
    recs = records()
    counts, one = run_clean(tmp_path / "one", recs, ONE_WORKER)
    _, two = run_clean(tmp_path / "two", recs, PROCESSES)
    assert counts["duplicates_by_kind"]["exact"] > 10 and counts["duplicates_by_kind"]["near"] > 5
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in two.iterdir())
    for name in names:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    kept = {i for k in range(7) for i in pq.read_table(one / clean.shard_name(k, 7)).column("id").to_pylist()}
    removed = pq.read_table(one / clean.REMOVED_FILE).to_pylist()
    assert all(r["cluster"] in kept for r in removed if r["outcome"] == "duplicate")
    assert counts["in"] == len(recs) == counts["kept"] + counts["duplicates"] + sum(
        counts["filtered"].values()) + sum(counts["quarantined"].values())


def test_a_concurrent_attempt_never_exposes_half_a_spill_file(tmp_path, monkeypatch):
    """Attempt A has written its temporary file; attempt B of the same bundle is half way
    through writing when A renames. With one temporary name for both (the defect this pins),
    B truncated A's file first and the final name held half a file; each attempt has its own."""
    path = tmp_path / "s00000-g00000-r000000000.arrow"
    columns = {name: [name * 2000] * 50 for name in spill.SPILL_SCHEMA.names}
    original = Path.write_bytes
    b_half, a_done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def attempt_b():
        try:
            spill.write_spill(OutputDir(path.parent), path.name, columns)
        except BaseException as e:  # noqa: BLE001 - B's own rename may fail; that is B's retry
            errors.append(e)

    def write_bytes(self, data):
        if threading.current_thread().name == "B":
            with open(self, "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                b_half.set()
                a_done.wait(5)
                f.write(data[len(data) // 2:])
            return len(data)
        n = original(self, data)
        threading.Thread(target=attempt_b, name="B").start()
        b_half.wait(5)
        return n

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    spill.write_spill(OutputDir(path.parent), path.name, columns)  # attempt A
    seen = path.read_bytes()  # what a reader of A's committed output gets
    a_done.set()
    for thread in threading.enumerate():
        if thread.name == "B":
            thread.join(10)
    monkeypatch.setattr(Path, "write_bytes", original)
    complete = Path(spill.write_spill(OutputDir(tmp_path), "ref.arrow", columns)).read_bytes()
    assert seen == complete, f"a reader saw {len(seen)} of {len(complete)} bytes"


def test_shard_writer_stub_memory_is_as_documented(tmp_path):
    """What the shard writer holds per document (read_stubs, then dedup_shard), against the
    figure read_stubs' docstring gives (about 360 bytes; 10% margin). Refs here are 44
    characters, ids 64."""
    n, paths = 20000, []
    for f in range(20):
        ids = [hashlib.sha256(f"{f}-{i}".encode()).hexdigest() for i in range(n // 20)]
        paths.append(spill.write_spill(OutputDir(tmp_path), f"s00000-g{f:05d}-r000000000.arrow", {
            "id": ids, "ref": [f"cc/CC-MAIN-2024-10/segment/{f}/warc/{i:08d}" for i in range(len(ids))],
            "source": ["fineweb-edu"] * len(ids), "language": ["en"] * len(ids), "fields": [None] * len(ids),
            "text": ["x" * 100] * len(ids)}))
    tracemalloc.start()
    try:
        kept, _, counts = dedup_shard(read_stubs(paths), {})
        per_doc = tracemalloc.get_traced_memory()[1] / n  # the peak, dedup's sort included
        assert len(kept) == counts["kept"] == n
    finally:
        tracemalloc.stop()
    print(f"{per_doc:.0f} bytes a document")
    assert per_doc <= 400, f"{per_doc:.0f} bytes a document"
