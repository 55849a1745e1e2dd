"""StepFiles: a step uploaded to an S3 server on loopback reads the same as its local directory,
and reading in place fetches only what is asked for (bytes_fetched)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.data.builders import write_clean_step
from tidal.data.shards import iter_documents, load_token_sequences, shard_names, write_token_shards
from tidal.files.npy import NpyRows
from tidal.files.step_files import StepFiles, bytes_fetched
from tidal.integrity.hashing import write_manifest
from tidal.train.loader import BatchLoader, TokenShards

HASH = "e" * 64
SEQ_LEN = 64


def wide_table(rows: int = 4000, columns: int = 24) -> pa.Table:
    rng = np.random.default_rng(0)
    data = {"id": [f"{i:08d}" for i in range(rows)]}
    for c in range(columns):  # random bytes as hex: incompressible, like real text after compression
        data[f"col{c:02d}"] = [rng.bytes(24).hex() for _ in range(rows)]
    return pa.table(data)


@pytest.fixture
def step_dir(tmp_path) -> Path:
    """A step with document shards, counts.json, a wide parquet file, token shards and a manifest."""
    step = write_clean_step(tmp_path / "step", [f"document {i} " + "word " * (i % 40) for i in range(300)], "en",
                            {"in": 300, "kept": 300, "filtered": {}, "duplicates": 0, "quarantined": {}})
    pq.write_table(wide_table(), step / "wide.parquet", row_group_size=1000)
    tokens = np.random.default_rng(1).integers(0, 60000, size=(3000, SEQ_LEN), dtype=np.uint16)
    write_token_shards(step, tokens, 3)
    (step / "meta.json").write_text(json.dumps({"tokenizer_hash": HASH, "seq_len": SEQ_LEN, "dtype": "uint16",
                                                "n_sequences": 3000}))
    (step / "sub").mkdir()
    (step / "sub" / "note.txt").write_text("nested\n")
    write_manifest(step)
    return step


def test_a_bucket_step_reads_like_its_local_directory(step_dir, upload):
    uri = upload(step_dir, "step-abc")
    local, remote = StepFiles.open(step_dir), StepFiles.open(uri)
    assert remote.uri == uri.rstrip("/") and remote.remote and not local.remote
    assert remote.names() == local.names() and "sub/note.txt" in remote.names()
    assert remote.names("tokens-*.npy") == ["tokens-00000-of-00003.npy", "tokens-00001-of-00003.npy",
                                            "tokens-00002-of-00003.npy"]
    assert shard_names(remote, "documents", "parquet") == shard_names(step_dir, "documents", "parquet")
    for name in ("counts.json", "sub/note.txt", "wide.parquet"):
        assert remote.size(name) == local.size(name) == (step_dir / name).stat().st_size
        assert remote.read_bytes(name) == local.read_bytes(name) == (step_dir / name).read_bytes()
    assert remote.read_json("counts.json") == local.read_json("counts.json")
    assert remote.read_range("wide.parquet", 100, 50) == (step_dir / "wide.parquet").read_bytes()[100:150]
    assert remote.exists("meta.json") and not remote.exists("nothing.json") and not remote.exists("sub")
    assert remote.local_path("meta.json") is None and local.local_path("meta.json") == step_dir / "meta.json"
    with remote.open_input("wide.parquet") as source:
        assert pq.read_table(source).equals(pq.read_table(step_dir / "wide.parquet"))
    assert list(iter_documents(uri)) == list(iter_documents(step_dir))
    np.testing.assert_array_equal(load_token_sequences(uri, HASH, SEQ_LEN), load_token_sequences(step_dir))
    picked = np.array([2999, 0, 1000, 1000, 17, 999])
    np.testing.assert_array_equal(load_token_sequences(uri, rows=picked), load_token_sequences(step_dir)[picked])


def test_token_batches_from_a_bucket_equal_the_local_memory_maps(step_dir, upload):
    uri = upload(step_dir, "tok-abc")
    local, remote = TokenShards(step_dir, tokenizer_hash=HASH), TokenShards(uri, tokenizer_hash=HASH)
    assert isinstance(local.shards[0], np.memmap) and isinstance(remote.shards[0], NpyRows)
    assert remote.n_sequences == local.n_sequences == 3000 and remote.remote
    a, b = BatchLoader(local, 16, seed=5), BatchLoader(remote, 16, seed=5)
    for step in [0, 1, 2, 7, 3, 4, 400]:  # in order (prefetched) and out of order
        np.testing.assert_array_equal(a.batch(step), b.batch(step))
    assert remote.locate(1500) == (f"{uri}tokens-00001-of-00003.npy", 500)


def test_npy_rows_index_like_numpy(step_dir, upload):
    uri = upload(step_dir, "npy-abc")
    rows = StepFiles.open(uri).array("tokens-00001-of-00003.npy")
    full = np.load(step_dir / "tokens-00001-of-00003.npy")
    assert rows.shape == full.shape and rows.dtype == full.dtype and len(rows) == 1000
    for key in (0, -1, 999, slice(10, 20), slice(None), slice(5, 50, 7), slice(30, 10),
                np.array([5, 4, 5, 999, 0]), np.array([], dtype=np.int64), [3, -2]):
        np.testing.assert_array_equal(rows[key], full[key])
    np.testing.assert_array_equal(np.asarray(rows), full)
    with pytest.raises(IndexError, match="npy-abc/tokens-00001-of-00003.npy"):
        rows[1000]
    with pytest.raises(IndexError, match=r"outside \[0, 1000\)"):
        rows[np.array([1, 1000])]


def test_npy_rows_read_long_headers_and_refuse_what_is_not_rows(tmp_path, upload):
    step = tmp_path / "npy"
    step.mkdir()
    wide = np.zeros(7, dtype=[(f"field_with_a_long_name_{i:02d}", "<i4") for i in range(40)])  # header > 512 B
    wide["field_with_a_long_name_03"] = np.arange(7)
    np.save(step / "wide.npy", wide)
    np.save(step / "fortran.npy", np.asfortranarray(np.arange(12, dtype=np.uint16).reshape(3, 4)))
    (step / "text.npy").write_text("not an array")
    files = StepFiles.open(upload(step, "npy-odd"))
    rows = files.array("wide.npy")
    assert rows.offset > 512 and rows[np.array([6, 3])].tolist() == wide[[6, 3]].tolist()
    with pytest.raises(ValueError, match="npy-odd/fortran.npy: Fortran-order"):
        files.array("fortran.npy")
    with pytest.raises(ValueError, match="npy-odd/text.npy: not a .npy file"):
        files.array("text.npy")


def test_two_columns_of_a_wide_parquet_file_fetch_a_fraction_of_it(step_dir, upload):
    uri = upload(step_dir, "wide-abc")
    files = StepFiles.open(uri)
    size = files.size("wide.parquet")
    before = bytes_fetched()
    with files.open_input("wide.parquet") as source:
        table = pq.read_table(source, columns=["id", "col03"])
    fetched = bytes_fetched() - before
    assert table.equals(pq.read_table(step_dir / "wide.parquet", columns=["id", "col03"]))
    assert 0 < fetched < size / 6, (fetched, size)  # 2 of 25 columns (the id column is small)
    before = bytes_fetched()
    with files.open_input("wide.parquet") as source:
        groups = pq.ParquetFile(source).read_row_group(2, columns=["col10"])
    assert groups.num_rows == 1000 and bytes_fetched() - before < size / 40


def test_a_few_token_rows_fetch_only_their_bytes(step_dir, upload):
    uri = upload(step_dir, "rows-abc")
    shards = TokenShards(uri, tokenizer_hash=HASH)  # metadata and the three .npy headers
    size = sum(StepFiles.open(uri).size(n) for n in StepFiles.open(uri).names("tokens-*.npy"))
    before = bytes_fetched()
    rows = shards.rows(np.array([3, 1500, 2999, 4]))
    fetched = bytes_fetched() - before
    assert rows.shape == (4, SEQ_LEN)
    assert fetched == 4 * SEQ_LEN * 2, fetched  # exactly the rows' bytes: uint16 ids
    assert fetched < size / 500


def test_local_reads_are_plain_files_and_fetch_nothing(step_dir):
    files = StepFiles.open(step_dir)
    before = bytes_fetched()
    arr = files.array("tokens-00000-of-00003.npy")
    assert isinstance(arr, np.memmap) and not arr.flags.writeable
    assert files.read_json("meta.json")["seq_len"] == SEQ_LEN
    assert files.local_copy("meta.json", step_dir.parent / "elsewhere") == step_dir / "meta.json"
    assert StepFiles.open(f"file://{step_dir}").read_bytes("meta.json") == (step_dir / "meta.json").read_bytes()
    assert bytes_fetched() == before


def test_missing_files_and_bad_json_name_the_uri(step_dir, upload, tmp_path):
    (step_dir / "bad.json").write_text("{not json")
    uri = upload(step_dir, "missing-abc")
    for files in (StepFiles.open(uri), StepFiles.open(step_dir)):
        where = f"{files.uri}/nothing.json"
        for read in (files.read_bytes, files.read_json, files.open_input, files.size, files.array):
            with pytest.raises(FileNotFoundError, match=f"{where} does not exist"):
                read("nothing.json")
        with pytest.raises(FileNotFoundError, match=f"{where} does not exist"):
            files.read_range("nothing.json", 0, 10)
        with pytest.raises(FileNotFoundError, match=f"{where} does not exist"):
            files.local_copy("nothing.json", tmp_path / "copies")
        with pytest.raises(ValueError, match=f"{files.uri}/bad.json: not valid JSON"):
            files.read_json("bad.json")


def test_local_copy_downloads_one_file_and_checks_the_manifest(step_dir, upload, tmp_path):
    uri = upload(step_dir, "copy-abc")
    files = StepFiles.open(uri)
    before = bytes_fetched()
    copy = files.local_copy("sub/note.txt", tmp_path / "copies")
    assert copy == tmp_path / "copies" / "sub" / "note.txt" and copy.read_text() == "nested\n"
    manifest = (step_dir / "manifest.json").stat().st_size
    assert bytes_fetched() - before == manifest + len("nested\n")  # the manifest once, then the file
    upload.client.put_object(Bucket=upload.bucket, Key="root/copy-abc/meta.json", Body=b'{"seq_len": 1}')
    with pytest.raises(OSError, match=r"copy-abc/meta.json: 14 bytes .* manifest.json says"):
        StepFiles.open(uri).read_json("meta.json")
    with pytest.raises(OSError, match="manifest.json says"):
        StepFiles.open(uri).local_copy("meta.json", tmp_path / "bad")
    assert not list((tmp_path / "bad").iterdir())  # no partial or unchecked copy left


def test_small_reads_survive_5xx_answers_that_the_sdk_gives_up_on(step_dir, upload, proxy):
    """A ranged GET shorter than S3's XML error body: pyarrow's SDK fails it as INTERNAL_FAILURE
    ("Failed to flush response stream") without retrying; tidal/files/retry.py retries it."""
    from tidal.files import retry

    uri = upload(step_dir, "step-503")
    proxy.plan.every, proxy.plan.statuses = 4, (503, 500)  # one request in 4: far above a real store's rate
    remote, local = StepFiles.open(uri), StepFiles.open(step_dir)
    before = retry.retried
    name = "tokens-00001-of-00003.npy"
    raw = (step_dir / name).read_bytes()
    for offset in range(0, 30 * 97, 97):  # 30-byte reads: each error body overflows them
        assert remote.read_range(name, offset, 30) == raw[offset:offset + 30]
    assert remote.array(name)[5:9].tolist() == local.array(name)[5:9].tolist()  # npy header + rows, small reads
    docs = shard_names(remote, "documents", "parquet")[0]
    with remote.open_input(docs) as handle, local.open_input(docs) as mine:  # parquet footer: 8-byte reads
        assert pq.read_table(handle).equals(pq.read_table(mine))
    assert proxy.plan.injected.get(503, 0) >= 5 and proxy.plan.injected.get(500, 0) >= 5, proxy.plan.injected
    assert retry.retried - before >= 10


def test_a_missing_object_is_not_retried(step_dir, upload, proxy):
    uri = upload(step_dir, "step-404")
    remote = StepFiles.open(uri)
    before = len(proxy.plan.log)
    with pytest.raises(FileNotFoundError, match="step-404/nope.npy"):
        remote.read_range("nope.npy", 0, 10)
    assert len(proxy.plan.log) - before <= 3  # the open and the existence check, no retry loop


def test_retries_are_bounded_and_only_for_transient_errors():
    from tidal.files.retry import is_transient, with_retries

    calls, waits = [], []

    def flaky() -> bytes:
        calls.append(1)
        raise OSError("AWS Error SLOW_DOWN during GetObject operation: Please reduce your request rate.")

    with pytest.raises(OSError, match="SLOW_DOWN"):
        with_retries(flaky, what="s3://b/k bytes 0+10", attempts=3, sleep=waits.append)
    assert len(calls) == 3 and len(waits) == 2 and all(0 <= w <= 0.1 for w in waits)
    assert not is_transient(OSError("AWS Error ACCESS_DENIED during GetObject operation"))
    assert not is_transient(ValueError("INTERNAL_FAILURE"))
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        with_retries(flaky, what="x", attempts=0)


def test_block_reads_from_a_bucket_equal_local_and_take_a_few_gets_per_step(step_dir, upload):
    """train.block_reads (tidal/train/blocks.py): the same batches from a bucket as from the memory maps, in
    whole blocks: GETs per step = rows per host / rows per block (+1 where a block crosses a shard), against
    one GET per row for shuffled single rows."""
    from tidal.files.step_files import ranged_gets

    uri = upload(step_dir, "blocks-abc")
    local, remote = TokenShards(step_dir, tokenizer_hash=HASH), TokenShards(uri, tokenizer_hash=HASH)
    block_bytes = 32 * SEQ_LEN * 2  # 32 rows of uint16
    a = BatchLoader(local, 16, seed=5, block_reads=(block_bytes, 2))
    b = BatchLoader(remote, 16, seed=5, block_reads=(block_bytes, 2))
    assert b.blocks.order.block_rows == 32
    before = ranged_gets()
    steps = 4 * 64  # four windows of 2 blocks x 32 rows
    for step in range(steps):
        np.testing.assert_array_equal(a.batch(step), b.batch(step))
    block_gets = ranged_gets() - before
    rows_loader = BatchLoader(TokenShards(uri, tokenizer_hash=HASH), 16, seed=5)
    before = ranged_gets()
    for step in range(8):
        rows_loader.batch(step)
    row_gets = (ranged_gets() - before) / (8 + 4)  # the rows loader read 4 steps ahead
    assert block_gets / steps <= 16 / 32 * 1.25, block_gets / steps  # 0.5 per step, a few blocks cross shards
    assert row_gets >= 10, row_gets  # about one per row
    fresh = BatchLoader(TokenShards(uri, tokenizer_hash=HASH), 16, seed=5, block_reads=(block_bytes, 2))
    np.testing.assert_array_equal(fresh.batch(150), a.batch(150))  # a resumed run reads the same batch
