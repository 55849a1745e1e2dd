"""Edge cases of the streaming clean and tokenize steps found by review: null texts and raw
bytes, spill files that must never reach a committed step, errors that name their files."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.data.builders import CORPUS_WORDS, write_clean_step
from tidal.context import SPILL_DIR, StepContext
from tidal.data import clean, fetch
from tidal.data import tokenize as tokenize_step
from tidal.data import tokenizer as tokenizer_step
from tidal.data.token_spill import encode_shard
from tidal.files.output import OutputDir

CONFIG = {"source": "toy", "input": "fetch-toy", "normalization": "NFC", "min_chars": 20,
          "max_chars": 400, "min_letter_fraction": 0.5}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("review-tok")
    texts = [" ".join(CORPUS_WORDS[(i * 5 + j * 3) % len(CORPUS_WORDS)] for j in range(1 + i % 30)) + f" {i}"
             for i in range(300)]
    source = write_clean_step(root / "clean-train", texts, "syn")
    tok = root / "tokenizer"
    tok.mkdir()
    config = {"mode": "train", "vocab_size": 300, "min_frequency": 2, "sources": ["clean-train"]}
    tokenizer_step.run(StepContext("tokenizer-r", "tokenizer", "tokenizer", config, tok, {"clean-train": source}))
    return tok


def document_shards(step_dir: Path, shards: list[list[tuple[str, str | None]]]) -> Path:
    """A hand-made clean step: one ``documents-*.parquet`` per list of ``(id, text)`` rows."""
    step_dir.mkdir(parents=True)
    for k, rows in enumerate(shards):
        table = pa.table({"id": pa.array([r[0] for r in rows], pa.string()),
                          "text": pa.array([r[1] for r in rows], pa.string()),
                          "source": pa.array(["syn"] * len(rows), pa.string())})
        pq.write_table(table, step_dir / f"documents-{k:05d}-of-{len(shards):05d}.parquet")
    return step_dir


def run_tokenize(tokenizer_dir: Path, clean_dir: Path, out: Path, seq_len: int = 8, shards: int = 2) -> dict:
    out.mkdir(parents=True)
    config = {"source": "syn", "input": "clean-syn", "tokenizer": "tokenizer", "seq_len": seq_len, "shards": shards}
    return tokenize_step.run(StepContext("tokenize-r", "tokenize-syn", "tokenize", config, out,
                                         {"clean-syn": clean_dir, "tokenizer": tokenizer_dir}))


def test_document_with_null_text_is_reported_as_failed_not_a_crash(tokenizer_dir, tmp_path):
    """A null text cannot be encoded: like any such document it is listed in
    failed_documents.json and the others are packed (the streaming batcher once crashed on it)."""
    rows = sorted([(sha("a"), "data model token"), (sha("b"), None), (sha("c"), "shard seed pipeline")])
    step = document_shards(tmp_path / "clean-syn", [rows])
    summary = run_tokenize(tokenizer_dir, step, tmp_path / "out")
    failed = json.loads((tmp_path / "out" / tokenize_step.FAILED_FILE).read_text())
    assert [f["id"] for f in failed] == [sha("b")] and failed[0]["error"].startswith("TypeError")
    assert summary["documents_failed"] == 1 and summary["n_documents"] == 2
    assert not (tmp_path / "out" / SPILL_DIR).exists()


def test_the_merge_stage_itself_removes_the_token_spills(tokenizer_dir, tmp_path):
    """A provider-launched cluster job is committed when the job ends, whether or not the
    launching process reached its own cleanup, so the job's last stage removes the spills."""
    import numpy as np

    spill_dir = tmp_path / "out" / SPILL_DIR
    docs = [(sha("x"), np.array([5, 6, 0], dtype=np.uint32)), (sha("y"), np.array([7, 0], dtype=np.uint32))]
    spills = [encode_shard(0, "documents-00000-of-00001.parquet", OutputDir(spill_dir), iter([(sorted(docs), [])]),
                           [], None)]
    assert spill_dir.is_dir()
    settings = {"seq_len": 2, "shards": 1, "vocab_size": 300, "tokenizer_hash": "h"}
    tokenize_step._merge_and_write(spills, OutputDir(tmp_path / "out"), settings, spill=OutputDir(spill_dir))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        tokenize_step.FAILED_FILE, "meta.json", "tokens-00000-of-00001.npy"]


def test_a_document_in_two_shards_is_refused_naming_both_files(tokenizer_dir, tmp_path):
    rows = [(sha("a"), "data model")]
    step = document_shards(tmp_path / "clean-syn", [rows, rows])
    with pytest.raises(ValueError, match=r"appears in two document shards, \S*documents-00000-of-00002\.parquet "
                                         r"and \S*documents-00001-of-00002\.parquet"):
        run_tokenize(tokenizer_dir, step, tmp_path / "out", shards=1)


def write_raw(path: Path, records: list[tuple[str, bytes | None]], row_group_size: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"source": ["toy"] * len(records), "ref": [r for r, _ in records],
                      "raw": pa.array([b for _, b in records], pa.binary())}, schema=fetch.RAW_SCHEMA)
    options = {**fetch.PARQUET_OPTIONS, **({"row_group_size": row_group_size} if row_group_size else {})}
    pq.write_table(table, path, **options)
    return path


def test_null_raw_bytes_are_refused_naming_file_and_record(tmp_path):
    records = [(f"z:{i}", b"The quick brown fox jumps over the lazy dog.") for i in range(4)] + [("z:null", None)]
    raw = write_raw(tmp_path / "fetch-toy" / "raw.parquet", records, row_group_size=2)
    with pytest.raises((ValueError, RuntimeError), match=r"raw\.parquet: row group 2, record 'z:null': 'raw' is "
                                                         r"NoneType"):
        clean.clean(raw, tmp_path / "out", clean.CleanConfig.model_validate({**CONFIG, "shards": 2}))
    assert not (tmp_path / "out" / "_spill").exists()


def test_no_spill_directory_after_success_or_failure(tmp_path):
    """Several batches (more than BATCH_ROWS records), 7 shards and near-dedup: the spill
    directory is gone after a successful run; and after a run that fails in the shard writer
    (a directory stands where a shard file must go)."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "river", "stone", "cloud", "paper", "window", "garden"]
    records = [(f"s:{i}", " ".join(words[(i * k) % len(words)] for k in range(1, 12)).encode() + b".")
               for i in range(1200)]
    raw = write_raw(tmp_path / "fetch-toy" / "raw.parquet", records)
    cfg = clean.CleanConfig.model_validate({**CONFIG, "shards": 7, "near_dedup": {"enabled": True}})
    counts = clean.clean(raw, tmp_path / "ok", cfg)
    assert counts["in"] == 1200 and counts["duplicates"] > 0
    assert not (tmp_path / "ok" / "_spill").exists()
    blocked = tmp_path / "failed" / clean.shard_name(3, 7)
    blocked.mkdir(parents=True)
    with pytest.raises(Exception, match="Is a directory"):
        clean.clean(raw, tmp_path / "failed", cfg)
    assert not (tmp_path / "failed" / "_spill").exists()


def test_raw_parquet_without_row_groups_gives_empty_shards(tmp_path):
    buf = io.BytesIO()
    pq.ParquetWriter(buf, fetch.RAW_SCHEMA).close()
    raw = tmp_path / "fetch-toy" / "raw.parquet"
    raw.parent.mkdir()
    raw.write_bytes(buf.getvalue())
    assert pq.read_metadata(raw).num_row_groups == 0
    counts = clean.clean(raw, tmp_path / "out", clean.CleanConfig.model_validate({**CONFIG, "shards": 3}))
    assert (counts["in"], counts["kept"]) == (0, 0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "counts.json", *(clean.shard_name(k, 3) for k in range(3)), "quarantine.parquet", "removed.parquet"]
