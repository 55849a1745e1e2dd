"""Benchmark: throughput of the clean step with every filter and near-dedup, against exact-dedup only.

Corpus (generated, seeded): ``--docs`` English-like documents of 8-14 sentences over a
5,000-word synthetic vocabulary plus Gopher's stop words, of which ``--planted`` fraction get
a near-duplicate: the same document with 1 to 5 of its words replaced, and every other variant
also re-cased (every third word upper case) and re-punctuated (``.`` -> ``!``, commas added), as a
copy edited by hand is. The true Jaccard of the 5-word shingle sets of the case- and
punctuation-folded texts (about 0.6-0.97) is measured and printed; recall counts the variants at or
above the threshold. Originals have refs ``d:N``,
variants ``v:N``, so an original is always the lowest ref and the survivor.

Both runs use the same in-process Beam runner, one worker, in the same process on the same
input file:

* full: C4 lines, Gopher repetition and quality, language ID, exact dedup, MinHash-LSH
  near-dedup (14 x 8, 5-word shingles, Jaccard >= 0.75: the defaults);
* baseline: the same pipeline with every quality filter and near-dedup off (exact dedup,
  normalization and language ID, which always runs, stay).

Near-dup recall: planted variants (whose measured Jaccard to their original is at or above
the threshold) removed as near duplicates of their original, over such variants; precision:
those correct removals over every near-duplicate removal.

    .venv/bin/python bench/data_throughput.py [--docs 20000] [--planted 0.1]

Last line: ``RESULT docs_per_s=... MB_per_s=... ratio_vs_exact_only=... neardup_recall=...
neardup_precision=... cpu_ratio_vs_exact_only=...`` (ratios: full throughput / baseline
throughput on the same documents, by wall clock and by this process's CPU time; the CPU
ratio is the steadier one on a shared machine, as the in-process runner works in this process).
"""

from __future__ import annotations

import argparse
import random
import string
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tidal.data import clean, fetch
from tidal.data.neardup import jaccard, shingles

STOP = ["the", "of", "and", "to", "with", "that", "have", "be", "in", "a"]


def vocabulary(rng: random.Random, n: int = 5000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return sorted({"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n)})


def sentence(rng: random.Random, vocab: list[str]) -> str:
    words = [rng.choice(STOP) if rng.random() < 0.3 else rng.choice(vocab) for _ in range(rng.randint(10, 16))]
    return " ".join(words).capitalize() + "."


def make_corpus(n_docs: int, planted: float, seed: int) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """``(records, {variant ref: original ref})``; records hold ``n_docs`` documents in total."""
    rng = random.Random(seed)
    vocab = vocabulary(rng)
    n_variants = int(n_docs * planted)
    originals = []
    for i in range(n_docs - n_variants):
        originals.append((f"d:{i}", [sentence(rng, vocab) for _ in range(rng.randint(8, 14))]))
    records = [(ref, "\n".join(s).encode()) for ref, s in originals]
    pairs = {}
    for j, (ref, sentences) in enumerate(rng.sample(originals, n_variants)):
        words = "\n".join(sentences).split(" ")
        for k in rng.sample(range(len(words)), rng.randint(1, 5)):  # 1-5 words replaced
            words[k] = rng.choice(vocab)
        if j % 2:  # every other variant also re-cased and re-punctuated, as a copy edited by hand is
            words = [w.upper() if i % 3 == 0 else w for i, w in enumerate(words)]
            words = [w.replace(".", "!") + ("," if i % 7 == 3 else "") for i, w in enumerate(words)]
        records.append((f"v:{j}", " ".join(words).encode()))
        pairs[f"v:{j}"] = ref
    return records, pairs


def folded(text: str) -> str:
    """Lower case, ASCII punctuation dropped (the corpus is ASCII)."""
    return text.lower().translate(str.maketrans("", "", string.punctuation))


def write_raw(records: list[tuple[str, bytes]], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({"source": ["bench"] * len(records), "ref": [r for r, _ in records],
                      "raw": pa.array([b for _, b in records], pa.binary())}, schema=fetch.RAW_SCHEMA)
    return fetch.write_parquet(table, directory / "raw.parquet")


def timed_clean(raw: Path, out: Path, config: dict) -> tuple[float, float, dict]:
    """``(wall seconds, CPU seconds of this process, counts)`` of one in-process clean run."""
    cfg = clean.CleanConfig.model_validate(config)
    started, cpu = time.perf_counter(), time.process_time()
    counts = clean.clean(raw, out, cfg, args=["--runner=FnApiRunner", "--direct_num_workers=1"])
    return time.perf_counter() - started, time.process_time() - cpu, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=20_000, help="documents in the corpus")
    parser.add_argument("--planted", type=float, default=0.1, help="fraction that are planted near-duplicates")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    records, pairs = make_corpus(args.docs, args.planted, args.seed)
    texts = {ref: raw.decode() for ref, raw in records}
    threshold = 0.75
    # ground truth: the Jaccard of the shingles of case- and punctuation-folded text (this bench's own
    # folding, independent of tidal's), so a re-cased copy counts as the near-duplicate it is
    sims = {v: jaccard(shingles(folded(texts[v]), 5), shingles(folded(texts[o]), 5)) for v, o in pairs.items()}
    positives = {v for v, s in sims.items() if s >= threshold}
    mb = sum(len(raw) for _, raw in records) / 1e6
    print(f"corpus: {len(records)} documents, {mb:.1f} MB, {len(pairs)} planted variants, "
          f"{len(positives)} at Jaccard >= {threshold} (min {min(sims.values()):.3f}, max {max(sims.values()):.3f})")

    base = {"source": "bench", "input": "fetch-bench", "shards": 4}
    full = {**base, "filters": {"c4": {}, "gopher_repetition": {}, "gopher_quality": {}},
            "near_dedup": {"enabled": True, "jaccard_threshold": threshold}}
    with tempfile.TemporaryDirectory() as tmp:
        raw = write_raw(records, Path(tmp) / "fetch")
        base_s, base_cpu, base_counts = timed_clean(raw, Path(tmp) / "baseline", base)
        full_s, full_cpu, full_counts = timed_clean(raw, Path(tmp) / "full", full)
        removed = pq.read_table(Path(tmp) / "full" / "removed.parquet").to_pylist()
        kept = {r["id"]: r["ref"]
                for p in sorted((Path(tmp) / "full").glob("documents-*.parquet")) for r in pq.read_table(p).to_pylist()}
    near = [r for r in removed if r["reason"] == "near"]
    correct = [r for r in near if r["ref"] in pairs and kept.get(r["cluster"]) == pairs[r["ref"]]]
    recall = len([r for r in correct if r["ref"] in positives]) / max(len(positives), 1)
    precision = len(correct) / max(len(near), 1)
    filtered = sum(full_counts["filtered"].values())
    print(f"baseline (exact dedup only): {base_s:.1f} s wall, {base_cpu:.1f} s CPU, "
          f"{len(records) / base_s:.0f} docs/s, {mb / base_s:.2f} MB/s, kept {base_counts['kept']}")
    print(f"full (filters + near-dedup): {full_s:.1f} s wall, {full_cpu:.1f} s CPU, "
          f"{len(records) / full_s:.0f} docs/s, "
          f"{mb / full_s:.2f} MB/s, kept {full_counts['kept']}, filtered {filtered}, near duplicates {len(near)} "
          f"({len(correct)} planted), candidate pairs {full_counts['neardup']['candidate_pairs']}")
    print(f"RESULT docs_per_s={len(records) / full_s:.1f} MB_per_s={mb / full_s:.3f} "
          f"ratio_vs_exact_only={base_s / full_s:.3f} neardup_recall={recall:.4f} neardup_precision={precision:.4f} "
          f"cpu_ratio_vs_exact_only={base_cpu / full_cpu:.3f}")


if __name__ == "__main__":
    main()
