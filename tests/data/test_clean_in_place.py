"""The clean step reads its fetch step's ``raw.parquet`` in place from a bucket (a moto S3 server on
loopback): the same bytes as from the local directory, without downloading the step (the contexts
here have no ``resolve``, so a download would fail), and of the file only the footer and the row
groups and columns a slice needs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.files.conftest import upload  # noqa: F401 - fixture used here
from tests.storage.conftest import bucket, moto_server, s3_env  # noqa: F401 - fixtures used by upload
from tidal.context import StepContext
from tidal.data import clean, fetch
from tidal.data.clean import fns as clean_fns
from tidal.files.output import OutputDir
from tidal.files.step_files import bytes_fetched

ENGLISH = "The quick brown fox jumps over the lazy dog near the river bank."
LONG = ("Rivers carry silt from the high valleys down to the wide plains where farmers have grown "
        "rice and barley for many centuries and the towns along the banks trade in grain and cloth")
LINES = [  # one jsonl line each: kept, exact and near duplicates, filtered, a line the reader cannot parse
    {"text": ENGLISH}, {"text": "\ufeff" + ENGLISH + "  \r\n"}, {"text": ENGLISH}, {"text": "   \r\n "},
    {"text": "short"}, {"text": "1234 5678 9012 3456 7890 1234 5678"}, {"text": "long " * 100},
    {"text": "气和玉烛，睿化著鸿明。缇管一阳生。郊禋盛礼燔柴毕，旋轸凤凰城。"},
    {"text": "\x1b[1;31mColoured terminal text survives as plain words\x1b[0m"},
    "{broken", {"text": LONG}, {"text": LONG + " today"}, {"text": LONG.replace("Rivers", "Streams")},
    {"text": "Ｆｕｌｌ－ｗｉｄｔｈ　ｌｅｔｔｅｒｓ，ｔｏｏ！"},
]
CONFIG = {"source": "web", "input": "fetch-web", "normalization": "NFC", "min_chars": 20, "max_chars": 400,
          "min_letter_fraction": 0.5, "shards": 3, "near_dedup": {"enabled": True}}


def files_of(step_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(step_dir).as_posix(): p.read_bytes() for p in sorted(step_dir.rglob("*")) if p.is_file()}


def fetch_step(root: Path, monkeypatch) -> Path:
    """A real fetch step output (``raw.parquet`` of several row groups and pages, ``files.json``)."""
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "a.jsonl").write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                                            for line in LINES))
    out = root / "fetch-web"
    out.mkdir()
    with monkeypatch.context() as patch:  # small row groups and pages: slices start inside groups and pages
        patch.setitem(fetch.PARQUET_OPTIONS, "row_group_size", 4)
        patch.setitem(fetch.PARQUET_OPTIONS, "data_page_size", 64)
        fetch.run(StepContext("fetch-web-1", "fetch-web", "fetch", {"source": "web", "format": "jsonl",
                                                                    "path": str(corpus), "text_field": "text"}, out))
    assert pq.read_metadata(out / fetch.RAW_FILE).num_row_groups == 4
    return out


def run_clean(out: Path, location: Path | str) -> dict:
    out.mkdir(parents=True)
    return clean.run(StepContext("clean-web-1", "clean-web", "clean", CONFIG, out, {"fetch-web": location}))


def test_clean_from_a_bucket_input_writes_the_local_bytes(tmp_path, monkeypatch, upload, s3_env):  # noqa: F811
    monkeypatch.setattr(clean_fns, "SLICE_ROWS", 3)  # slices of 3 rows in groups of 4, read a row at a time
    monkeypatch.setattr(clean_fns, "READ_ROWS", 1)
    monkeypatch.setattr(clean_fns, "READ_BUFFER_BYTES", 256)
    monkeypatch.delenv("TIDAL_BEAM_ARGS", raising=False)  # the in-process runner: its reads count here
    step_dir = fetch_step(tmp_path, monkeypatch)
    want_summary = run_clean(tmp_path / "local", step_dir)
    assert want_summary["quarantined_malformed_json"] == 1 and want_summary["kept"] == 5
    assert want_summary["duplicates_exact"] == 2 and want_summary["duplicates_near"] == 2
    uri = upload(step_dir, "fetch-web-0123456789ab")
    before = bytes_fetched()
    summary = run_clean(tmp_path / "bucket", uri)
    assert bytes_fetched() > before  # read from the bucket, in this process (the in-process runner)
    assert summary == want_summary
    assert files_of(tmp_path / "bucket") == files_of(tmp_path / "local")
    cache = tmp_path / "cache"  # the storage layer's download cache (s3_env)
    assert not cache.exists() or not any(cache.rglob("*"))


def test_missing_bucket_input_names_the_file(tmp_path, upload):  # noqa: F811
    step_dir = tmp_path / "fetch-web"
    step_dir.mkdir()
    (step_dir / fetch.FILES_FILE).write_text("{}\n")  # a step prefix without raw.parquet
    uri = upload(step_dir, "fetch-web-0123456789ab")
    with pytest.raises(FileNotFoundError, match=r"clean: input s3://.*/fetch-web-0123456789ab/raw.parquet does not"):
        run_clean(tmp_path / "out", uri)


def random_text(rng: random.Random, words: int) -> bytes:
    return " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
                    for _ in range(words)).encode()


def test_a_slice_fetches_only_its_row_group_and_columns(tmp_path, monkeypatch, upload):  # noqa: F811
    """Two row groups of four pages (a page holds at least 1,024 rows: pyarrow's write batch) and a
    column clean never reads: :func:`raw_slices` fetches the footer; a slice at the end of the
    second group fetches that group's chunks of the fetch columns; a short slice at the start of a
    group stops fetching after the page holding its last row."""
    rng = random.Random(7)
    n = 8192
    table = pa.table({"source": ["web"] * n, "ref": [f"a.jsonl:{i + 1}" for i in range(n)],
                      "raw": pa.array([random_text(rng, 40) for _ in range(n)], pa.binary()),
                      "reason": pa.nulls(n, pa.string()), "detail": pa.nulls(n, pa.string()),
                      "padding": pa.array([rng.randbytes(256) for _ in range(n)], pa.binary())})
    step_dir = tmp_path / "fetch-web"
    step_dir.mkdir()
    monkeypatch.setitem(fetch.PARQUET_OPTIONS, "row_group_size", n // 2)
    monkeypatch.setitem(fetch.PARQUET_OPTIONS, "data_page_size", 16 << 10)  # pages of one write batch
    fetch.write_parquet(table, step_dir / fetch.RAW_FILE)
    meta = pq.read_metadata(step_dir / fetch.RAW_FILE)

    def chunk_bytes(group: int, names: set[str]) -> int:
        row_group = meta.row_group(group)
        return sum(row_group.column(c).total_compressed_size for c in range(row_group.num_columns)
                   if row_group.column(c).path_in_schema in names)

    wanted = set(fetch.FETCH_SCHEMA.names)
    raw_uri = upload(step_dir, "fetch-web-0123456789ab") + fetch.RAW_FILE

    before = bytes_fetched()
    assert clean_fns.raw_slices(raw_uri, 3000) == clean_fns.raw_slices(step_dir / fetch.RAW_FILE, 3000) == [
        (0, 0, 3000), (0, 3000, 1096), (1, 0, 3000), (1, 3000, 1096)]
    assert bytes_fetched() - before <= 64 << 10  # the footer (the reader's 64 KiB tail read)

    cfg = clean.CleanConfig.model_validate({**CONFIG, "near_dedup": {"enabled": False}})
    batch_fn = clean_fns.CleanBatchFn(raw_uri, cfg, OutputDir(tmp_path / "spill"), cfg.shards)
    before = bytes_fetched()
    assert list(batch_fn.process(((1, 3000), [1096])))
    fetched = bytes_fetched() - before
    assert chunk_bytes(1, wanted) <= fetched <= chunk_bytes(1, wanted) + (64 << 10)
    assert fetched < chunk_bytes(1, {"padding"})

    monkeypatch.setattr(clean_fns, "READ_BUFFER_BYTES", 16 << 10)
    before = bytes_fetched()
    assert list(batch_fn.process(((0, 0), [10])))
    assert bytes_fetched() - before < (64 << 10) + chunk_bytes(0, wanted) // 2
