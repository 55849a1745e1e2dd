"""Snapshot pins, the small clean graph with row-group slices and the per-record fast paths:
edge cases a new user hits (capped fetches, names sha256sum escapes, exact copies of near
duplicates, many slices on two processes, degenerate sources, the langid switch)."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess

import pyarrow.parquet as pq
import pytest

from tests.data.test_clean import write_raw
from tidal.context import SPILL_DIR, StepContext
from tidal.data import clean, fetch, langid
from tidal.data.clean import fns as clean_fns

ONE_WORKER = ["--runner=FnApiRunner", "--direct_num_workers=1"]
PROCESSES = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
WORDS = ["river", "mill", "grain", "market", "bridge", "stone", "summer", "merchant", "wool", "silver", "timber",
         "amber", "honey", "leather", "harbour", "lantern", "orchard", "meadow", "valley", "forest", "the", "and",
         "of", "with", "that", "to", "have", "be", "copper", "glass", "salt", "horses", "cloth", "spices"]


def document(i: int) -> str:
    rng = random.Random(i)
    return "\n".join(" ".join(rng.sample(WORDS, 12)).capitalize() + "." for _ in range(8))


def near_copy(i: int, variant: int = 0) -> str:
    lines = document(i).split("\n")
    lines[variant] = f"Changed{variant} " + lines[variant].split(" ", 1)[1]
    return "\n".join(lines)


def sha256sum_snapshot(root, names: list[str]) -> str:
    """The definition (docs/explanation/data-steps.md, "Reading"): sha256sum of the files in read order,
    piped into sha256sum."""
    lines = subprocess.run(["sha256sum", *names], cwd=root, capture_output=True, check=True).stdout
    return hashlib.sha256(lines).hexdigest()


def run_fetch(tmp_path, name: str, config: dict) -> dict:
    out = tmp_path / name
    out.mkdir()
    return fetch.run(StepContext("fetch-web-1", "fetch-web", "fetch", config, out))


# ---------------------------------------------------------------- snapshot pins


def test_a_capped_fetch_hashes_the_files_it_read_and_says_so(tmp_path):
    """With max_documents, fetch stops early: the hash covers the files read (the output
    depends on nothing else). A pin of the files read passes, and so does a full-folder pin
    (what `tidal plan` hashes, issue 21 item 13); any other fails with a message naming the cap."""
    root = tmp_path / "web"
    root.mkdir()
    (root / "a.jsonl").write_bytes(b'{"text": "one"}\n{"text": "two"}\n')
    (root / "b.jsonl").write_bytes(b'{"text": "three"}\n')
    full = sha256sum_snapshot(root, ["a.jsonl", "b.jsonl"])
    config = {"source": "web", "format": "jsonl", "path": str(root), "text_field": "text"}
    assert run_fetch(tmp_path, "full", {**config, "snapshot_sha256": full})["documents"] == 3
    assert run_fetch(tmp_path, "capped", {**config, "max_documents": 1, "snapshot_sha256": full})["documents"] == 1
    with pytest.raises(ValueError, match="max_documents=1 stopped reading at a.jsonl"):
        run_fetch(tmp_path, "capped-wrong", {**config, "max_documents": 1, "snapshot_sha256": "c" * 64})
    read = sha256sum_snapshot(root, ["a.jsonl"])
    assert run_fetch(tmp_path, "capped-ok", {**config, "max_documents": 1, "snapshot_sha256": read})["documents"] == 1


def test_snapshot_equals_sha256sum_for_a_name_with_a_backslash(tmp_path):
    """readers.snapshot_sha256's docstring: "Equal to sha256sum of the files ... piped into
    sha256sum again". GNU sha256sum escapes a name holding a backslash or newline."""
    root = tmp_path / "txt"
    root.mkdir()
    (root / "a.txt").write_bytes(b"plain document")
    (root / "back\\slash.txt").write_bytes(b"another document")
    summary = run_fetch(tmp_path, "out", {"source": "web", "format": "text", "path": str(root)})
    assert summary["snapshot_sha256"] == sha256sum_snapshot(root, ["a.txt", "back\\slash.txt"])


def test_pin_survives_hidden_files_and_catches_rename_add_remove(tmp_path):
    """Works today: hidden files are neither read nor hashed; a rename, an added (even empty)
    or a removed file fails a pinned fetch, naming the path and both hashes, writing nothing."""
    root = tmp_path / "web"
    root.mkdir()
    (root / "a.jsonl").write_bytes(b'{"text": "one"}\n')
    (root / "b.jsonl").write_bytes(b'{"text": "two"}\n')
    config = {"source": "web", "format": "jsonl", "path": str(root), "text_field": "text"}
    pin = run_fetch(tmp_path, "first", config)["snapshot_sha256"]
    assert pin == sha256sum_snapshot(root, ["a.jsonl", "b.jsonl"])
    (root / ".hidden.jsonl").write_bytes(b'{"text": "hidden"}\n')
    assert run_fetch(tmp_path, "hidden", {**config, "snapshot_sha256": pin})["documents"] == 2
    changes = [lambda: (root / "b.jsonl").rename(root / "c.jsonl"), lambda: (root / "z.jsonl").write_bytes(b""),
               lambda: (root / "b.jsonl").unlink()]
    for n, change in enumerate(changes):
        for name in ("b.jsonl", "c.jsonl", "z.jsonl"):
            (root / name).unlink(missing_ok=True)
        (root / "b.jsonl").write_bytes(b'{"text": "two"}\n')
        change()
        with pytest.raises(ValueError, match="changed since the recipe pinned them") as err:
            run_fetch(tmp_path, f"changed{n}", {**config, "snapshot_sha256": pin})
        assert pin in str(err.value) and str(root) in str(err.value)
        assert list((tmp_path / f"changed{n}").iterdir()) == []


# ---------------------------------------------------------------- clean: slices and clusters


def clean_files(tmp_path, name: str, records, config: dict, args: list[str]) -> tuple[dict, dict]:
    raw_dir = write_raw(tmp_path / f"raw-{name}", records)
    out = tmp_path / name
    counts = clean.clean(raw_dir / "raw.parquet", out, clean.CleanConfig.model_validate(config), args=args)
    assert not (out / SPILL_DIR).exists()
    return counts, {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def reconciles(counts: dict) -> bool:
    return counts["in"] == (counts["kept"] + sum(counts["filtered"].values()) + counts["duplicates"]
                            + sum(counts["quarantined"].values()))


def test_exact_copy_of_a_near_duplicate_names_the_survivor_as_cluster(tmp_path):
    """d:1 survives; n:1 is its near duplicate; n:2 is an exact copy of n:1. Every duplicate
    row's cluster should be a kept document's id (docs/explanation/data-steps.md: "the survivor's id as cluster")."""
    records = [("d:1", document(1).encode()), ("n:1", near_copy(1).encode()), ("n:2", near_copy(1).encode())]
    config = {"source": "toy", "input": "fetch-toy", "near_dedup": {"enabled": True, "jaccard_threshold": 0.6}}
    counts, _ = clean_files(tmp_path, "out", records, config, ONE_WORKER)
    assert counts["kept"] == 1 and counts["duplicates_by_kind"] == {"exact": 1, "near": 1}
    kept = pq.read_table(tmp_path / "out" / clean.shard_name(0, 1)).column("id").to_pylist()
    removed = {r["ref"]: r for r in pq.read_table(tmp_path / "out" / clean.REMOVED_FILE).to_pylist()}
    assert removed["n:1"]["cluster"] in kept
    assert removed["n:2"]["cluster"] in kept, "an exact copy of a removed near duplicate points at a removed id"


def test_near_duplicates_across_many_slices_same_bytes_on_two_processes(tmp_path, monkeypatch):
    """Works today: near-duplicate clusters spread over 7-row slices, with exact copies, bad
    and short records, cleaned by two processes give the bytes of one worker with whole row
    groups; counts reconcile and no spill directory is left."""
    records = [(f"d:{i}", document(i).encode()) for i in range(120)]
    records += [(f"n{v}:{i}", near_copy(i, v).encode()) for i in range(0, 120, 9) for v in range(2)]
    records += [(f"x:{i}", document(3).encode()) for i in range(4)] + [("bad:1", b"caf\xe9 " * 10), ("s:1", b"tiny")]
    random.Random(5).shuffle(records)
    config = {"source": "toy", "input": "fetch-toy", "shards": 5,
              "near_dedup": {"enabled": True, "jaccard_threshold": 0.6}}
    counts, expected = clean_files(tmp_path, "whole", records, config, ONE_WORKER)
    assert (reconciles(counts) and counts["duplicates_by_kind"]["near"] > 0
            and counts["duplicates_by_kind"]["exact"] == 4)
    monkeypatch.setattr(clean_fns, "SLICE_ROWS", 7)
    assert len(clean_fns.raw_slices(tmp_path / "raw-whole" / "raw.parquet")) > 20
    sliced_counts, files = clean_files(tmp_path, "sliced", records, config, PROCESSES)
    assert sliced_counts == counts and files == expected


@pytest.mark.parametrize("kind", ["zero_rows", "all_quarantined", "all_filtered", "all_exact_duplicates"])
def test_degenerate_sources_reconcile_with_one_row_slices(tmp_path, monkeypatch, kind):
    """Works today: every shard file and the small files exist, counts add up, no spill left."""
    monkeypatch.setattr(clean_fns, "SLICE_ROWS", 1)
    records = {"zero_rows": [], "all_quarantined": [(f"x:{i}", b"caf\xe9 " * 10) for i in range(4)],
               "all_filtered": [(f"x:{i}", b"short") for i in range(4)],
               "all_exact_duplicates": [(f"x:{i}", document(1).encode()) for i in range(4)]}[kind]
    config = {"source": "toy", "input": "fetch-toy", "shards": 3, "near_dedup": {"enabled": True}}
    counts, files = clean_files(tmp_path, "out", records, config, ONE_WORKER)
    assert reconciles(counts) and counts["in"] == len(records)
    assert counts["kept"] == (1 if kind == "all_exact_duplicates" else 0)
    assert set(files) == {clean.COUNTS_FILE, clean.QUARANTINE_FILE, clean.REMOVED_FILE,
                          *(clean.shard_name(k, 3) for k in range(3))}
    assert json.loads(files[clean.COUNTS_FILE]) == counts


# ---------------------------------------------------------------- langid fast path


def _langid_texts() -> list[str]:
    en = "The quick brown fox jumps over the lazy dog near the river bank. "
    texts = ["Привет, как дела? Это тест русского текста. " * 3, "Καλημέρα κόσμε, ελληνικό κείμενο. " * 4,
             "مرحبا بالعالم هذا نص عربي للاختبار. " * 4, "cafe\u0301 na\u0308ive " * 30, "a" + "\u0300" * 400,
             "𠀀𠀁𠀂" * 40, "😀 word " * 60, "ALL UPPER CASE SHOUTING TEXT HERE. " * 9, en + "\x00" * 10 + en]
    for n in range(244, 258):  # both sides of VECTOR_FROM_BYTES, multi-byte characters straddling it
        texts += [(en * 5)[:n], "é" * (n // 2) + "x" * (n % 2), "中" * (n // 3) + "a" * (n % 3),
                  "😀" * (n // 4 - 1) + "ab" + "c" * (n % 4), ("Привет " * 40).encode()[:n].decode("utf-8", "ignore")]
    return texts


def test_identify_equals_py3langid_classify_on_scripts_and_the_250_byte_switch():
    """Works today: same label and rounded confidence as py3langid's classify (norm_probs)."""
    from py3langid import langid as py3
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    reference = LanguageIdentifier.from_modelpath(py3.MODEL_DIR / MODEL_FILE, norm_probs=True)
    for text in _langid_texts():
        lang, prob = reference.classify(text)
        assert langid.identify(text) == (lang, round(float(prob), 4)), repr(text[:60])
