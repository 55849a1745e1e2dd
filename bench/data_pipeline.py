"""Benchmark: tidal's clean + dedup + tokenize on the tiny recipe's real corpora at 1x, 4x, 16x,
against bare ``tokenizers`` and datatrove doing the comparable pipeline, in the same run.

    .venv/bin/python bench/data_pipeline.py [--scales 1,4,16] [--workers 1] [--stride 16]

Input (not timed): the fetch steps of ``recipes/tiny.yaml`` (brown, gcide with its
``max_documents``, songci, udhr) run into a temporary storage root from the archive cache,
giving each source's ``raw.parquet`` (quarantined reader records included; 42,085 records,
32 MB). 1x is every ``--stride``-th record of each source (default 16: 2,632 records, about
2 MB, so that 16x, about the whole fetched corpus in size, fits the bench in about 10 minutes
on 2 shared cores; ``--stride 1`` makes 1x the whole corpus). Scale ``k`` holds ``k``
copies of every 1x record: copy 0 is the record as fetched; copy ``c >= 1`` has
ref ``c<c>/<ref>`` and, on every line, its words (whitespace-separated; for a line without
spaces, its characters) shuffled by ``random.Random(f"{c}/{ref}")`` except the line's last
word/character (so C4's terminal punctuation and the line structure stay). The copies keep
the vocabulary, word lengths, line counts, script and language of the original, but not its
5-word / 5-character shingles, so neither exact nor near dedup collapses them; a line with
fewer than 3 words is left as it is, so a few short records stay duplicates (printed).
Reader-quarantined records are copied verbatim.

Tokenizer (not timed): a byte-level BPE of the recipe's size (``tokenizer.vocab_size``) trained
once with :func:`tidal.data.tokenizer.train_tokenizer` on the 1x brown + gcide + songci
text, written as a tokenizer step directory; every system uses this one ``tokenizer.json``.

Systems, each size in its own subprocess (peak RSS = the largest ``ru_maxrss`` of the child
and of its own children, i.e. of the largest single process, not a sum):

* tidal: per source, the recipe's clean step config (normalization, basic filters, the
  source's quality filters, py3langid, exact dedup, MinHash-LSH near dedup with verified
  Jaccard) via :func:`tidal.data.clean.run`, then :func:`tidal.data.tokenize.run` (encode,
  pack, write shards), with Beam's FnApiRunner and ``--workers`` workers (for more than one:
  ``--direct_running_mode=multi_processing``); ``TOKENIZERS_PARALLELISM=false``. The default,
  one worker, is tidal's default runner setting; with 2 workers Beam's multi-processing mode
  starts worker processes for each of the eight pipelines, which here cost more than a
  minute at every scale (1x: 70 s for 2 MB; datatrove with 2 workers: 62 s).
* datatrove 0.10.1 per source, ``LocalPipelineExecutor(tasks=workers, workers=workers)``:
  ``ParquetReader`` -> the same filter set as the recipe gives tidal (``C4QualityFilter``,
  ``GopherRepetitionFilter``, ``GopherQualityFilter``) -> ``ParquetWriter`` ->
  ``MinhashDedupSignature`` (14 x 8, 5-grams, sha1 hashes: xxhash is not installed), then
  ``MinhashDedupBuckets`` (14 tasks), ``MinhashDedupCluster``, and ``ParquetReader`` ->
  ``MinhashDedupFilter`` -> ``DocumentTokenizer`` (same local ``tokenizer.json``, EOS
  appended, no shuffling). Left out, and so not timed for datatrove: language ID
  (``LanguageFilter`` downloads a fastText model from the hub), text normalization and
  exact dedup (tidal does both). datatrove's default word tokenizers need spaCy or NLTK
  data, neither installed nor downloadable here, so its filters and MinHash get a
  ``WordTokenizer`` that splits words exactly like tidal (:func:`tidal.data.filters.words`)
  and sentences with datatrove's own ``WhitespaceTokenizer`` regex; that is cheaper than
  spaCy, i.e. it favours datatrove.
* bare tokenization: ``Tokenizer.from_file(tokenizer.json).encode_batch`` over the same
  documents (decoded with ``errors="replace"``), batches of 1,000, with
  ``RAYON_NUM_THREADS=workers`` and ``TOKENIZERS_PARALLELISM=true``; then, timed apart,
  ``encode_batch_fast`` (ids only, what tidal's tokenize step calls), printed as
  ``ratio_vs_bare_tokenize_fast``.

MB = the scale's raw input bytes (every record's bytes, as fetched), the same number for
every system; MB/s = MB / wall seconds of the work in the child (imports and process start
excluded, pipeline start-up included). For tidal, "imports" include the modules its pipelines
import lazily on their first run (Beam's in-process runner and SDK worker, datasketch, which
brings in scipy, py3langid, ``pyarrow.dataset``, the tokenize step: ``TIDAL_PRE_IMPORTS``),
imported before the clock starts like the top-level ones.

Last line: ``RESULT mbps=<tidal MB/s at the largest scale> ratio_vs_datatrove=<tidal MB/s /
datatrove MB/s at the largest scale both ran> ratio_vs_bare_tokenize=<tidal MB/s / bare MB/s,
largest scale> growth_16x=<(t_16/t_4)/4> rss_ratio_16x_4x=<tidal peak RSS 16x / 4x>
growth_16x_vs_1x=<(t_16/t_1)/16> ...``. ``growth_16x`` uses 4x as its base because the
1x time is dominated by the fixed start-up of eight Beam pipelines (printed separately: the
1x-based figure is also given, and ``marginal_growth``: the time per added copy from 4x to 16x
over that from 1x to 4x, where the fixed start-up cancels out), then ``cpu_ratio_vs_datatrove``
and ``cpu_ratio_vs_bare_tokenize``: the same comparisons in CPU seconds (user + system of the
child and its children) instead of wall seconds, steadier when other work shares the cores.
Targets (issue 3): ratio_vs_datatrove >= 1.5,
ratio_vs_bare_tokenize >= 0.4, growth_16x <= 1.1, rss_ratio_16x_4x about 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
RECIPE = REPO / "recipes" / "tiny.yaml"
SOURCES = ("brown", "gcide", "songci", "udhr")
BARE_BATCH = 1000
# what tidal's pipelines import (lazily) on their first run: imported before the timed part
TIDAL_PRE_IMPORTS = ("apache_beam", "apache_beam.runners.portability.fn_api_runner",
                     "apache_beam.runners.worker.sdk_worker", "apache_beam.typehints.opcodes",
                     "datasketch", "py3langid", "pyarrow.dataset", "tidal.data.clean", "tidal.data.tokenize")


# ---------------------------------------------------------------- input


def shuffle_line(line: str, rng: random.Random) -> str:
    """Shuffle a line's words (or, without spaces, its characters), keeping the last one."""
    words = line.split(" ")
    if len(words) >= 3:
        head = words[:-1]
        rng.shuffle(head)
        return " ".join([*head, words[-1]])
    if len(words) == 1 and len(line) >= 3:
        head = list(line[:-1])
        rng.shuffle(head)
        return "".join(head) + line[-1]
    return line


def perturb(raw: bytes, copy: int, ref: str) -> bytes:
    """Copy ``copy`` (>= 1) of a record (module docstring); bytes that are not UTF-8 survive."""
    rng = random.Random(f"{copy}/{ref}")
    text = raw.decode("utf-8", errors="surrogateescape")
    return "\n".join(shuffle_line(line, rng) for line in text.split("\n")).encode("utf-8", errors="surrogateescape")


def scaled_rows(rows: list[dict], scale: int) -> list[dict]:
    """``scale`` copies of the raw.parquet rows (module docstring)."""
    out = list(rows)
    for copy in range(1, scale):
        for row in rows:
            raw = row["raw"] if row.get("reason") else perturb(row["raw"], copy, row["ref"])
            out.append({**row, "ref": f"c{copy}/{row['ref']}", "raw": raw})
    return out


def prepare(work: Path, scales: list[int], workers: int, stride: int) -> dict:
    """Fetch, train the tokenizer, write every scale's inputs; returns the plan for children."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidal.core.load import load_pipeline
    from tidal.data import fetch
    from tidal.data import tokenizer as tokenizer_step

    pipe = load_pipeline(RECIPE, storage_root=str(work / "store"))
    rows: dict[str, list[dict]] = {}
    configs: dict[str, dict] = {}
    started = time.perf_counter()
    for source in SOURCES:
        step = pipe.graph[f"fetch-{source}"]
        pipe.run(step.name)
        table = pq.read_table(pipe.storage.step_dir(step.step_id) / fetch.RAW_FILE)
        rows[source] = table.to_pylist()[::stride]
        configs[source] = dict(pipe.graph[f"clean-{source}"].config)
    tok_cfg = pipe.graph["tokenizer"].config
    seq_len = pipe.graph["tokenize-brown"].config["seq_len"]
    print(f"1x = every {stride}th fetched record: {sum(len(r) for r in rows.values())} records, "
          f"in {time.perf_counter() - started:.1f} s", flush=True)

    texts = [r["raw"].decode("utf-8", errors="replace") for s in tok_cfg["sources"]
             for r in rows[s.removeprefix("clean-")] if not r.get("reason")]
    tok = tokenizer_step.train_tokenizer(texts, int(tok_cfg["vocab_size"]), int(tok_cfg["min_frequency"]),
                                         tok_cfg["special_tokens"])
    tok_dir = work / "tokenizer"
    tok_dir.mkdir()
    data = tok.to_str(pretty=False).encode()
    (tok_dir / tokenizer_step.TOKENIZER_FILE).write_bytes(data)
    meta = tokenizer_step.tokenizer_meta(data, tok_cfg["special_tokens"])
    (tok_dir / tokenizer_step.META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")

    plan = {"scales": {}, "tokenizer": str(tok_dir), "configs": configs, "seq_len": seq_len, "workers": workers,
            "eos": tok_cfg["special_tokens"][0]}
    for scale in scales:
        base = work / f"x{scale}"
        total = 0
        for source in SOURCES:
            scaled = scaled_rows(rows[source], scale)
            total += sum(len(r["raw"]) for r in scaled)
            raw_dir = base / "raw" / source
            raw_dir.mkdir(parents=True)
            fetch.write_parquet(pa.Table.from_pylist(scaled, schema=fetch.FETCH_SCHEMA), raw_dir / fetch.RAW_FILE)
            # datatrove / bare input: the same records as text, split into `workers` files
            dt_dir = base / "dt-in" / source
            dt_dir.mkdir(parents=True)
            texts = [r["raw"].decode("utf-8", errors="replace") for r in scaled]
            ids = [r["ref"] for r in scaled]
            for k in range(workers):
                pq.write_table(pa.table({"id": ids[k::workers], "text": texts[k::workers]}),
                               dt_dir / f"part-{k:03d}.parquet")
        plan["scales"][str(scale)] = {"dir": str(base), "bytes": total,
                                      "records": sum(len(r) for r in rows.values()) * scale}
    return plan


# ---------------------------------------------------------------- children


def run_tidal(plan: dict, scale: str) -> dict:
    """Clean + tokenize every source at ``scale``; returns counts."""
    from tidal.context import StepContext
    from tidal.data import clean, tokenize

    base = Path(plan["scales"][scale]["dir"])
    out = {"kept": 0, "duplicates_exact": 0, "duplicates_near": 0, "filtered": 0, "quarantined": 0, "tokens": 0}
    for source in SOURCES:
        cfg = plan["configs"][source]
        clean_dir = base / "tidal" / f"clean-{source}"
        clean_dir.mkdir(parents=True)
        ctx = StepContext(f"clean-{source}", f"clean-{source}", "clean", cfg, clean_dir,
                          inputs={cfg["input"]: base / "raw" / source})
        summary = clean.run(ctx)
        for key in ("kept", "duplicates_exact", "duplicates_near", "filtered", "quarantined"):
            out[key] += summary[key]
        tok_dir = base / "tidal" / f"tokenize-{source}"
        tok_dir.mkdir()
        tcfg = {"source": source, "input": f"clean-{source}", "tokenizer": "tokenizer",
                "seq_len": plan["seq_len"], "shards": 2}
        tctx = StepContext(f"tokenize-{source}", f"tokenize-{source}", "tokenize", tcfg, tok_dir,
                           inputs={f"clean-{source}": clean_dir, "tokenizer": Path(plan["tokenizer"])})
        out["tokens"] += tokenize.run(tctx)["encoded_tokens"]
    return out


def _datatrove_word_tokenizer():
    from datatrove.utils.word_tokenizers import WhitespaceTokenizer

    from tidal.data.filters import words

    class TidalWords(WhitespaceTokenizer):
        """tidal's word split (CJK characters are words); datatrove's regex sentence split."""

        def word_tokenize(self, text: str) -> list[str]:
            return words(text)

    return TidalWords()


def run_datatrove(plan: dict, scale: str) -> dict:
    """The comparable datatrove pipeline per source (module docstring)."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer
    from datatrove.pipeline.writers import ParquetWriter
    from datatrove.utils.hashing import HashConfig

    workers = plan["workers"]
    base = Path(plan["scales"][scale]["dir"])
    word_tok = _datatrove_word_tokenizer()
    config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, seed=1,
                           hash_config=HashConfig(hash_fc="sha1", precision=64))
    kept = 0
    for source in SOURCES:
        root = base / "datatrove" / source
        filters_cfg = plan["configs"][source].get("filters") or {}
        filters = []
        if filters_cfg.get("c4") is not None:
            filters.append(C4QualityFilter(language=word_tok))
        if filters_cfg.get("gopher_repetition") is not None:
            filters.append(GopherRepetitionFilter(language=word_tok))
        if filters_cfg.get("gopher_quality") is not None:
            filters.append(GopherQualityFilter(language=word_tok))

        def execute(pipeline, tasks, name, root=root):
            LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(workers, tasks),
                                  logging_dir=str(root / "logs" / name), skip_completed=False).run()

        execute([ParquetReader(str(base / "dt-in" / source)), *filters,
                 ParquetWriter(str(root / "filtered"), output_filename="${rank}.parquet"),
                 MinhashDedupSignature(str(root / "sigs"), config=config, language=word_tok)], workers, "s1")
        execute([MinhashDedupBuckets(str(root / "sigs"), str(root / "buckets"), config=config)],
                config.num_buckets, "s2")
        execute([MinhashDedupCluster(str(root / "buckets"), str(root / "remove"), config=config)], 1, "s3")
        execute([ParquetReader(str(root / "filtered")), MinhashDedupFilter(str(root / "remove")),
                 DocumentTokenizer(str(root / "tokens"),
                                   tokenizer_name_or_path=str(Path(plan["tokenizer"]) / "tokenizer.json"),
                                   eos_token=plan["eos"], shuffle_documents=False)], workers, "s4")
        for stats in sorted((root / "logs" / "s4" / "stats").glob("*.json")):
            for block in json.loads(stats.read_text()):
                if block.get("name", "").endswith("MinHash stage 4"):
                    kept += int(block.get("stats", {}).get("forwarded", 0))
    return {"kept": kept}


def run_bare(plan: dict, scale: str) -> dict:
    """``encode_batch`` over every document of the scale."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    base = Path(plan["scales"][scale]["dir"])
    texts = [t for s in SOURCES for p in sorted((base / "dt-in" / s).glob("*.parquet"))
             for t in pq.read_table(p).column("text").to_pylist()]
    tok = Tokenizer.from_file(str(Path(plan["tokenizer"]) / "tokenizer.json"))
    tok.encode_special_tokens = True
    started, cpu = time.perf_counter(), cpu_seconds()
    tokens = 0
    for i in range(0, len(texts), BARE_BATCH):
        tokens += sum(len(e.ids) for e in tok.encode_batch(texts[i : i + BARE_BATCH], add_special_tokens=False))
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    started = time.perf_counter()  # what tidal's tokenize step calls (ids only, no offsets)
    for i in range(0, len(texts), BARE_BATCH):
        tok.encode_batch_fast(texts[i : i + BARE_BATCH], add_special_tokens=False)
    return {"tokens": tokens, "_seconds": seconds, "_cpu_seconds": cpu,
            "fast_seconds": round(time.perf_counter() - started, 3)}


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def child(system: str, plan_path: str, scale: str) -> None:
    """Run one system at one scale and print one JSON line."""
    logging.basicConfig(level=logging.WARNING)
    plan = json.loads(Path(plan_path).read_text())
    fn = {"tidal": run_tidal, "datatrove": run_datatrove, "bare": run_bare}[system]
    if system == "datatrove":
        import datatrove  # noqa: F401  (imports outside the timed part)
        from loguru import logger

        logger.remove()
    elif system == "tidal":
        import importlib

        for module in TIDAL_PRE_IMPORTS:
            importlib.import_module(module)
    started, cpu = time.perf_counter(), cpu_seconds()
    result = fn(plan, scale)
    seconds = result.pop("_seconds", None) or time.perf_counter() - started
    cpu = result.pop("_cpu_seconds", None) or cpu_seconds() - cpu
    print("CHILD " + json.dumps({"seconds": seconds, "cpu_s": round(cpu, 2), "rss_mb": peak_rss_kb() / 1024, **result}),
          flush=True)


def peak_rss_kb() -> int:
    """Peak RSS (KiB) of the largest single process of this job: this process's ``VmHWM``
    (exec starts a fresh one; ``ru_maxrss`` would inherit the bench parent's peak across
    fork + exec) and ``ru_maxrss`` of its waited-for children (Beam / datatrove workers)."""
    status = Path("/proc/self/status").read_text()
    hwm = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)


def spawn(system: str, plan_path: Path, scale: int, workers: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if system == "tidal":
        env["TOKENIZERS_PARALLELISM"] = "false"
        env["RAYON_NUM_THREADS"] = "1"
        env["TIDAL_BEAM_ARGS"] = (f"--direct_num_workers={workers} --direct_running_mode=multi_processing"
                                  if workers > 1 else "")
    elif system == "bare":
        env["TOKENIZERS_PARALLELISM"] = "true"
        env["RAYON_NUM_THREADS"] = str(workers)
    else:
        env["TOKENIZERS_PARALLELISM"] = "false"
        env["RAYON_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, __file__, "--child", system, str(plan_path), str(scale)],
                          env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CHILD ")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise RuntimeError(f"{system} at {scale}x failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("CHILD "):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", default="1,4,16")
    parser.add_argument("--datatrove-scales", default=None, help="scales datatrove runs at (default: --scales)")
    parser.add_argument("--workers", type=int, default=1, help="workers of every system (module docstring)")
    parser.add_argument("--stride", type=int, default=16, help="1x = every STRIDE-th fetched record of each source")
    parser.add_argument("--work-dir", help="keep inputs and outputs here (default: a temporary directory)")
    parser.add_argument("--child", nargs=3, metavar=("SYSTEM", "PLAN", "SCALE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    logging.basicConfig(level=logging.WARNING)
    scales = [int(s) for s in args.scales.split(",")]
    dt_scales = [int(s) for s in (args.datatrove_scales or args.scales).split(",") if s]
    tmp = None if args.work_dir else tempfile.TemporaryDirectory(prefix="tidal-bench-")
    work = Path(args.work_dir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    plan = prepare(work, sorted(set(scales) | set(dt_scales)), args.workers, args.stride)
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan))
    print(f"workers: {args.workers} (tidal: Beam FnApiRunner{' multi_processing' if args.workers > 1 else ''}; "
          f"datatrove: LocalPipelineExecutor; bare: RAYON_NUM_THREADS={args.workers}); cores: {os.cpu_count()}")
    results: dict[str, dict[int, dict]] = {"tidal": {}, "datatrove": {}, "bare": {}}
    for scale in sorted(set(scales) | set(dt_scales)):
        mb = plan["scales"][str(scale)]["bytes"] / 1e6
        systems = (["tidal", "bare"] if scale in scales else []) + (["datatrove"] if scale in dt_scales else [])
        for system in systems:
            r = spawn(system, plan_path, scale, args.workers)
            results[system][scale] = r
            extra = " ".join(f"{k}={v}" for k, v in r.items() if k not in ("seconds", "rss_mb", "cpu_s"))
            print(f"{system:<9} {scale:>2}x {mb:7.1f} MB {plan['scales'][str(scale)]['records']:>8} records "
                  f"{r['seconds']:7.1f} s (CPU {r['cpu_s']:7.1f} s) {mb / r['seconds']:6.2f} MB/s "
                  f"peak RSS {r['rss_mb']:6.0f} MB  {extra}",
                  flush=True)
    top = max(scales)
    mbps = {s: {k: plan["scales"][str(k)]["bytes"] / 1e6 / v["seconds"] for k, v in results[s].items()}
            for s in results}
    both = max(set(results["tidal"]) & set(results["datatrove"]), default=None)
    ratio_dt = mbps["tidal"][both] / mbps["datatrove"][both] if both else float("nan")
    ratio_bare = mbps["tidal"][top] / mbps["bare"][top]
    ratio_bare_fast = results["bare"][top]["fast_seconds"] / results["tidal"][top]["seconds"]
    t = {k: v["seconds"] for k, v in results["tidal"].items()}
    growth4 = (t[16] / t[4]) / 4 if 16 in t and 4 in t else float("nan")
    growth1 = (t[16] / t[1]) / 16 if 16 in t and 1 in t else float("nan")
    # time per added copy from 4x to 16x over that from 1x to 4x (fixed start-up cancels out)
    marginal = ((t[16] - t[4]) / 12) / ((t[4] - t[1]) / 3) if {1, 4, 16} <= set(t) else float("nan")
    rss = (results["tidal"].get(16, {}).get("rss_mb", float("nan"))
           / results["tidal"].get(4, {}).get("rss_mb", float("nan")))
    print(f"datatrove compared at {both}x; bare tokenization and mbps at {top}x; growth_16x base 4x "
          f"(1x base: {growth1:.3f})")
    cpu = {sy: {k: v["cpu_s"] for k, v in results[sy].items()} for sy in results}
    cpu_dt = cpu["datatrove"][both] / cpu["tidal"][both] if both else float("nan")
    cpu_bare = cpu["bare"][top] / cpu["tidal"][top]
    print(f"CPU-time ratios (work per CPU second; steadier than wall clock on a shared machine): "
          f"cpu_ratio_vs_datatrove={cpu_dt:.3f} cpu_ratio_vs_bare_tokenize={cpu_bare:.3f}")
    print(f"RESULT mbps={mbps['tidal'][top]:.3f} ratio_vs_datatrove={ratio_dt:.3f} "
          f"ratio_vs_bare_tokenize={ratio_bare:.3f} "
          f"growth_16x={growth4:.3f} rss_ratio_16x_4x={rss:.3f} growth_16x_vs_1x={growth1:.3f} "
          f"ratio_vs_bare_tokenize_fast={ratio_bare_fast:.3f} marginal_growth={marginal:.3f} "
          f"datatrove_scale={both} workers={args.workers} cpu_ratio_vs_datatrove={cpu_dt:.3f} "
          f"cpu_ratio_vs_bare_tokenize={cpu_bare:.3f}")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
