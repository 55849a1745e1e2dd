"""Determinism of the clean step with every filter and near-dedup on: the same bytes across reruns,
worker counts, running modes (in-process threads and separate processes) and input row order."""

from __future__ import annotations

import random

import pytest

from tests.data.test_clean import write_raw
from tidal.data import clean

WORDS = ["river", "mill", "grain", "market", "bridge", "stone", "summer", "merchant", "wool", "silver", "timber",
         "amber", "honey", "leather", "harbour", "lantern", "orchard", "meadow", "valley", "forest", "the", "and", "of",
         "with", "that", "to", "have", "be", "copper", "glass", "salt", "horses", "cloth", "spices", "pottery", "wine",
         "boats", "carts", "farmers", "children"]


def document(i: int) -> str:
    rng = random.Random(i)
    return "\n".join(" ".join(rng.sample(WORDS, 12)).capitalize() + "." for _ in range(8))


def corpus() -> list[tuple[str, bytes]]:
    records = []
    for i in range(60):
        records.append((f"d:{i}", document(i).encode()))
    for i in range(0, 60, 6):  # planted near-duplicates: one word changed (Jaccard ~0.9, so LSH
        text = document(i).split("\n")  # proposes each pair with probability 1 - (1 - 0.9^8)^14 > 0.999)
        text[3] = "Changed " + text[3].split(" ", 1)[1]
        records.append((f"n:{i}", "\n".join(text).encode()))
    records += [(f"x:{i}", document(i).encode()) for i in range(5)]  # exact duplicates
    records += [("bad:1", b"caf\xe9 " * 10),
                ("cjk:1", "春风又绿江南岸。明月何时照我还。千山鸟飞绝。万径人踪灭。".encode()),
                ("short:1", b"too short"), ("rep:1", ("same line here.\n" * 20).encode())]
    return records


CONFIG = {"source": "toy", "input": "fetch-toy", "shards": 3,
          "filters": {"c4": {"min_sentences": 3}, "gopher_repetition": {}, "gopher_quality": {"min_words": 20}},
          "language": {"allowed": ["en", "zh"]}, "near_dedup": {"enabled": True, "jaccard_threshold": 0.6}}
MODES = {
    "one_worker": ["--runner=FnApiRunner", "--direct_num_workers=1"],
    "threads": ["--runner=FnApiRunner", "--direct_num_workers=3", "--direct_running_mode=multi_threading"],
    "processes": ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
}


def run(tmp_path, name, args, records):
    raw_dir = write_raw(tmp_path / f"raw-{name}", records)
    out = tmp_path / name
    counts = clean.clean(raw_dir / "raw.parquet", out, clean.CleanConfig.model_validate(CONFIG), args=args)
    return counts, {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run(tmp_path_factory.mktemp("det"), "reference", MODES["one_worker"], corpus())


def test_reference_run_exercises_every_outcome(reference):
    counts, files = reference
    assert counts["duplicates_by_kind"]["near"] == 10 and counts["duplicates_by_kind"]["exact"] == 5
    assert counts["quarantined"]["invalid_utf8"] == 1 and counts["filtered"]["too_short"] == 1
    assert sum(counts["filtered"].values()) >= 2 and counts["languages"]["en"] == counts["kept"] >= 50
    assert set(files) == {"counts.json", "quarantine.parquet", "removed.parquet",
                          *(clean.shard_name(k, 3) for k in range(3))}


@pytest.mark.parametrize("mode", ["one_worker", "threads", "processes"])
def test_same_bytes_across_reruns_workers_and_running_modes(reference, tmp_path, mode):
    _, expected = reference
    _, files = run(tmp_path, mode, MODES[mode], corpus())
    assert files.keys() == expected.keys()
    for name in files:
        assert files[name] == expected[name], name


def test_same_bytes_whatever_the_input_row_order(reference, tmp_path):
    _, expected = reference
    shuffled = corpus()
    random.Random(7).shuffle(shuffled)
    _, files = run(tmp_path, "shuffled", MODES["threads"], shuffled)
    assert files == expected
