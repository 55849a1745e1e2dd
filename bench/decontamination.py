"""Benchmark: the decontaminate step's time against the clean step's, on the same documents, in one run.

Corpus: :func:`bench.data_throughput.make_corpus` (``--docs`` English-like documents of 8-14 sentences,
one a line, 10 % planted near-duplicates), cleaned with the recipe's full filter set and near-dedup as
in ``bench/data_throughput.py``. Eval set: ``--eval-docs`` documents of the same generator with
another seed, ten joined into one (~1,500 words: UDHR, the tiny recipe's eval source, has 532 such
translations and 851,559 distinct 13-grams; this set has about 750,000). ``--planted`` of the training documents
get one eval sentence (a paragraph of 10-16 words, below 13 words never matched) appended.

Timed, in this process: the clean step (in-process Beam runner, one worker) on the training raw
records, then the decontaminate step (index build + check, plain pyarrow) on its output. The eval
source's own clean step is not counted: a recipe cleans its eval sources anyway.

    .venv/bin/python bench/decontamination.py [--docs 20000] [--eval-docs 532]

Last line: ``RESULT decont_docs_per_s=... clean_docs_per_s=... added_time_ratio=... cpu_added_time_ratio=...
planted_recall=... false_removals=...`` (added ratio: decontaminate seconds / clean seconds; recall:
planted paragraphs of 13 words or more removed, over those; false removals: other paragraphs removed).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from bench.data_throughput import make_corpus, timed_clean, write_raw
from tidal.context import StepContext
from tidal.data import decontaminate as decon
from tidal.data.decontaminate_config import DEFAULT_N
from tidal.data.filters import words
from tidal.data.neardup import fold_text

EVAL_PIECES = 10  # generated documents per eval document: ~1,500 words, as a UDHR translation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=20_000, help="training documents")
    parser.add_argument("--eval-docs", type=int, default=532, help="eval documents (UDHR has 532)")
    parser.add_argument("--planted", type=float, default=0.02, help="training documents given an eval sentence")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    records, _ = make_corpus(args.docs, 0.1, args.seed)
    pieces, _ = make_corpus(args.eval_docs * EVAL_PIECES, 0.0, args.seed + 1)  # eval documents of ~1,500 words
    evals = [(f"e:{i}", b"\n".join(raw for _, raw in pieces[i * EVAL_PIECES:(i + 1) * EVAL_PIECES]))
             for i in range(args.eval_docs)]
    rng = random.Random(args.seed)
    sentences = [s for _, raw in evals for s in raw.decode().split("\n")]
    planted: dict[str, str] = {}
    for i in rng.sample(range(len(records)), int(len(records) * args.planted)):
        ref, raw = records[i]
        planted[ref] = rng.choice(sentences)
        records[i] = (ref, raw + b"\n" + planted[ref].encode())
    long_planted = {ref for ref, s in planted.items() if len(words(fold_text(s))) >= DEFAULT_N}
    mb = sum(len(raw) for _, raw in records) / 1e6
    clean_cfg = {"source": "bench", "input": "fetch-bench", "shards": 4,
                 "filters": {"c4": {}, "gopher_repetition": {}, "gopher_quality": {}}, "near_dedup": {"enabled": True}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        clean_s, clean_cpu, counts = timed_clean(write_raw(records, tmp_path / "fetch"), tmp_path / "clean", clean_cfg)
        timed_clean(write_raw(evals, tmp_path / "fetch-eval"), tmp_path / "clean-eval",
                    {**clean_cfg, "source": "eval", "input": "fetch-eval"})
        config = {"source": "bench", "input": "clean", "threshold": 0.5, "eval": {"eval": "clean-eval"}}
        out = tmp_path / "decontaminate"
        out.mkdir()
        ctx = StepContext("d", "decontaminate-bench", "decontaminate", config, out,
                          {"clean": tmp_path / "clean", "clean-eval": tmp_path / "clean-eval"})
        started, cpu = time.perf_counter(), time.process_time()
        summary = decon.run(ctx)
        decon_s, decon_cpu = time.perf_counter() - started, time.process_time() - cpu
        removed = pq.read_table(out / decon.REMOVED_FILE).to_pylist()
        cleaned = {ref for p in sorted((tmp_path / "clean").glob("documents-*.parquet"))
                   for ref in pq.read_table(p, columns=["ref"]).column("ref").to_pylist()}
    long_planted &= cleaned  # a planted document the clean step removed (a near duplicate) is not checked
    found = {r["ref"] for r in removed if r["outcome"] == "paragraph"}
    recall = len(found & long_planted) / max(len(long_planted), 1)
    false = len([r for r in removed if r["ref"] not in planted])
    n = counts["kept"]
    print(f"corpus: {len(records)} documents, {mb:.1f} MB, {len(planted)} with an eval sentence "
          f"({len(long_planted)} of 13 words or more, kept by clean); eval: {len(evals)} documents, "
          f"{summary['index_ngrams_eval']} distinct 13-grams; clean kept {n}")
    print(f"clean: {clean_s:.1f} s wall, {clean_cpu:.1f} s CPU; decontaminate: {decon_s:.2f} s wall, "
          f"{decon_cpu:.2f} s CPU, {summary['paragraphs_contaminated']} paragraphs contaminated "
          f"({len(found & set(planted))} in planted documents)")
    print(f"RESULT decont_docs_per_s={n / decon_s:.1f} clean_docs_per_s={len(records) / clean_s:.1f} "
          f"added_time_ratio={decon_s / clean_s:.3f} cpu_added_time_ratio={decon_cpu / clean_cpu:.3f} "
          f"planted_recall={recall:.4f} false_removals={false}")


if __name__ == "__main__":
    main()
