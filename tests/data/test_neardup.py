"""Near-duplicates: shingles, MinHash-LSH candidates, Jaccard verification and star clustering,
in unit tests and through the real clean pipeline."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.data.test_clean import write_raw
from tidal.context import StepContext
from tidal.data import clean
from tidal.data.neardup import (
    SHINGLE_JOIN,
    NearDupConfig,
    band_keys,
    bucket_pairs,
    jaccard,
    shingles,
    signature,
)
from tidal.data.neardup_clusters import star_clusters

# 200 distinct words: "w0 w1 ... " with letters so every filter passes.
BASE = [f"word{chr(97 + i % 26)}{i}" for i in range(200)]


def variant(changes: list[int]) -> str:
    words = list(BASE)
    for i in changes:
        words[i] = f"changed{i}"
    return " ".join(words)


A = variant([])
B = variant([30, 90, 150])                    # J(A, B) = 181/211 = 0.858
C = variant([30, 90, 150, 60, 120, 180])      # J(B, C) = 0.858, J(A, C) = 166/226 = 0.735


def test_shingles_of_short_documents_are_the_whole_word_sequence():
    assert shingles("alpha beta gamma", 5) == frozenset(["alpha" + SHINGLE_JOIN + "beta" + SHINGLE_JOIN + "gamma"])
    assert shingles("", 5) == frozenset()
    assert len(shingles(A, 5)) == 196
    assert jaccard(shingles("alpha beta gamma", 5), shingles("alpha  beta\ngamma", 5)) == 1.0
    assert jaccard(shingles("alpha beta gamma", 5), shingles("alpha beta gamma delta epsilon zeta", 5)) == 0.0
    assert len(shingles("春风又绿江南岸", 5)) == 3  # CJK: character shingles


def test_planted_similarities_are_what_the_chain_needs():
    sa, sb, sc = (shingles(t, 5) for t in (A, B, C))
    assert round(jaccard(sa, sb), 3) == 0.858 and round(jaccard(sb, sc), 3) == 0.858
    assert jaccard(sa, sc) < 0.75


def test_signature_and_bands_are_deterministic_and_seeded():
    cfg = NearDupConfig(enabled=True)
    sig = signature(A, cfg)
    assert sig.shape == (112,) and sig.dtype.name == "uint32"
    keys = band_keys(sig, cfg)
    assert keys.shape == (14,) and keys.dtype.name == "uint64" and len(set(keys.tolist())) == 14
    assert (keys == band_keys(signature(A, cfg), cfg)).all()
    other = NearDupConfig(enabled=True, seed=2)
    assert not set(band_keys(signature(A, other), other).tolist()) & set(keys.tolist())
    # equal bands give equal keys only at the same band index
    sig_b = signature(B, cfg)
    same = [b for b in range(14) if (sig[b * 8 : (b + 1) * 8] == sig_b[b * 8 : (b + 1) * 8]).all()]
    assert [b for b in range(14) if keys[b] == band_keys(sig_b, cfg)[b]] == same
    swapped = sig.copy().reshape(14, 8)[[1, 0, *range(2, 14)]].reshape(-1)
    assert band_keys(swapped, cfg)[0] != keys[1] and band_keys(swapped, cfg)[1] != keys[0]


def test_bucket_pairs_all_pairs_or_a_star_from_the_survivor_when_large():
    refs = {"c": "s:1", "a": "s:10", "b": "s:2", "d": "s:3"}
    assert bucket_pairs({k: refs[k] for k in "cab"}, 64) == [("a", "b"), ("a", "c"), ("b", "c")]
    # over the cap: the star starts at the lowest ref ("s:1" < "s:2" < "s:3" < "s:10", natural order)
    assert bucket_pairs(refs, 3) == [("a", "c"), ("b", "c"), ("c", "d")]
    assert bucket_pairs({"b": "s:5", "a": "s:5"}, 1) == [("a", "b")]  # equal refs: the lower id


def test_star_clusters_never_merge_an_unverified_chain():
    # A~B, B~C verified; A~C not: B joins A (lowest ref), C stays its own survivor.
    edges = [("idB", "r:2", "idC", "r:3", 0.86), ("idA", "r:1", "idB", "r:2", 0.86)]
    assert star_clusters(edges) == {"idB": ("idA", 0.86)}
    # the survivor is the lowest ref whatever the edge order; ties of ref impossible within a source
    assert star_clusters(list(reversed(edges))) == {"idB": ("idA", 0.86)}
    triangle = [*edges, ("idA", "r:1", "idC", "r:3", 0.8)]
    assert star_clusters(triangle) == {"idB": ("idA", 0.86), "idC": ("idA", 0.8)}


def test_config_is_validated():
    with pytest.raises(ValueError, match="jaccard_threshold"):
        NearDupConfig.model_validate({"enabled": True, "jaccard_threshold": 0})
    with pytest.raises(ValueError, match="enable\n  Extra inputs are not permitted"):
        NearDupConfig.model_validate({"enable": True})
    with pytest.raises(ValueError, match="exceeds 1024"):
        NearDupConfig.model_validate({"bands": 200, "rows": 8})
    assert NearDupConfig.model_validate({"enabled": True}).num_perm == 112


def run_near(tmp_path, name, records):
    raw_dir = write_raw(tmp_path / f"fetch-{name}", records)
    out = tmp_path / name
    out.mkdir()
    config = {"source": "toy", "input": "fetch-toy", "max_chars": 400_000, "shards": 2,
              "near_dedup": {"enabled": True}}
    ctx = StepContext("c", "clean-toy", "clean", config, out, inputs={"fetch-toy": raw_dir})
    return clean.run(ctx), out


def kept_refs(out):
    return sorted(r["ref"] for k in range(2) for r in pq.read_table(out / clean.shard_name(k, 2)).to_pylist())


def test_pipeline_removes_verified_near_duplicates_only(tmp_path):
    unrelated = " ".join(f"other{chr(97 + i % 26)}{i}" for i in range(120))
    records = [("r:1", A.encode()), ("r:2", B.encode()), ("r:3", C.encode()), ("r:4", unrelated.encode()),
               ("r:5", b"alpha beta gamma delta"), ("r:6", b"alpha beta  gamma delta")]  # short: one shingle
    summary, out = run_near(tmp_path, "forward", records)
    assert kept_refs(out) == ["r:1", "r:3", "r:4", "r:5"]
    assert (summary["duplicates_near"], summary["duplicates_exact"]) == (2, 0)
    removed = {r["ref"]: r for r in pq.read_table(out / "removed.parquet").to_pylist()}
    ids = {r["ref"]: r["id"] for k in range(2) for r in pq.read_table(out / clean.shard_name(k, 2)).to_pylist()}
    assert removed["r:2"]["cluster"] == ids["r:1"] and removed["r:2"]["detail"] == "jaccard=0.857820"
    assert removed["r:6"]["cluster"] == ids["r:5"] and removed["r:6"]["detail"] == "jaccard=1.000000"
    counts = json.loads((out / "counts.json").read_text())
    assert counts["duplicates"] == 2 and counts["kept"] == 4 and counts["in"] == 6
    # A-B, B-C and r:5-r:6 pass the check; any other candidate (A-C at 0.735) was checked and refused
    assert counts["neardup"]["verified_pairs"] == 3 <= counts["neardup"]["candidate_pairs"]
    assert summary["neardup_verified_pairs"] == 3
    # reversed refs: C is now the lowest ref, so it survives and B joins it; A (0.735 to C) stays
    flipped = [("r:1", C.encode()), ("r:2", B.encode()), ("r:3", A.encode())]
    _, out = run_near(tmp_path, "flipped", flipped)
    assert kept_refs(out) == ["r:1", "r:3"]


def test_band_entries_and_partition_pairs_collapse_exact_copies():
    from tidal.data.neardup import band_entries, partition_pairs
    from tidal.data.normalize import document_id

    cfg = NearDupConfig(enabled=True)
    id_a, id_b = document_id(A), document_id(B)
    other = " ".join(f"other{i}" for i in range(200))
    # (id, ref, text, shard, row): batch 0 holds A's copy "a:10" at shard 1 row 0, batch 1 its copy "a:2"
    batches = [[(id_a, "a:10", A, 1, 0), (document_id(other), "o:1", other, 0, 0)],
               [(id_b, "b:1", B, 0, 0), (id_a, "a:2", A, 1, 4)]]
    by_partition: dict = {}
    for n, batch in enumerate(batches):  # entries of several batches meet in their partitions, as after the shuffle
        for part, chunk in band_entries(batch, cfg, partitions=4).items():
            keys, members, ids, refs, places = chunk
            assert set((keys % 4).tolist()) == {part} and keys.dtype.name == "uint64" and ids.shape[1:] == (32,)
            assert refs.shape == (len(ids),) and places.shape == (len(ids), 2)
            assert members.max() < len(ids)
            by_partition.setdefault(part, []).append((f"spill/bands-b{n}.npz", chunk))
    found = [partition_pairs(chunks, 64) for chunks in by_partition.values()]
    pairs = sorted({p for part_pairs, _ in found for p in part_pairs})
    assert pairs == [tuple(sorted([id_a, id_b]))]  # A's two copies are one id; `other` meets nobody
    # every partition that finds A names its lowest-ref copy, where batch 1 put it
    copies = {doc_id: copy for _, part_copies in found for doc_id, copy in part_copies.items()}
    assert copies == {id_a: ("a:2", "spill/s00001-b1.arrow", 4), id_b: ("b:1", "spill/s00000-b1.arrow", 0)}
    assert band_entries([("e" * 64, "e:1", "", 0, 0)], cfg) == {}  # no shingle, no entry
    # ids ending in zero bytes survive the compact form (numpy "S" strings would strip them)
    zero_a, zero_b = "ab" * 31 + "00", "cd" * 30 + "0000"
    chunks = band_entries([(zero_a, "z:1", A, 0, 0), (zero_b, "z:2", A, 0, 1)], cfg, partitions=1)
    assert partition_pairs([("bands-z.npz", c) for c in chunks.values()], 64)[0] == [(zero_a, zero_b)]
