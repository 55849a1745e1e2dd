"""Stats step: one tidy table (source, metric, value) over the clean, tokenize and mix outputs.

Invariant: the rows are a pure function of the committed input directories, sorted by
(source, metric), every value a float64; the metric names are the contract the gate reads
(docs/contracts.md, "Stats rows"), so a name here changes only together with that page.

Rows, per cleaned source ``src`` (from ``counts.json`` and the documents parquet):
    documents_in, documents_kept, documents_filtered (sum over rules), documents_duplicate,
    documents_quarantined (sum over reasons), quarantine_rate and duplicate_rate (over
    documents_in; 0 when it is 0), bytes_kept (UTF-8 bytes of kept text), chars_p50,
    chars_p90 (document length in characters, numpy's default linear-interpolation
    percentile; 0 when no document is kept), ``filter_rate/<rule>`` (filtered by that rule
    / documents_in) and ``quarantine/<reason>`` (documents quarantined for that reason,
    a count). When the clean step's ``counts.json`` has them (clean v2): chars_p10,
    chars_p99, ``duplicate_rate/exact`` and ``duplicate_rate/near`` (over documents_in),
    ``hit_rate/<rule>`` (documents failing the rule, first hit or not, / documents_in),
    ``language/<code>`` (share of kept documents), ``repaired/<reason>`` (a count).
Per tokenized source: tokens (packed tokens, ``n_tokens``), sequences and, when the
    tokenize step's meta has them (tokenize v2), ``unknown_token_rate`` and
    ``byte_fallback_rate`` (over every encoded token, end-of-text ids excluded).
Per mixture source: mixture_weight_requested (normalized), mixture_weight_realized,
    mixture_sequences, mixture_epochs (sequences taken / sequences the tokenize step packed;
    above 1: up-sampled) and mixture_tokens_unused (tokens never taken; 0 once used whole).
Per decontaminated source (:func:`decontaminate_rows`, with the ``decontaminate`` config key):
    documents_contaminated, paragraphs_contaminated, contaminated_rate (over the documents the step
    read) and ``contaminated/<eval source>`` (paragraphs); summed (rate recomputed) for ``all``.
Source ``all``: total_tokens (tokens in the mixture), mixture_tokens_unused and
    mixture_unused_token_fraction (unused over the mixture sources' packed tokens), quarantine_rate (quarantined over
    documents_in, summed over every cleaned source), documents_in, documents_kept; with
    clean v2 inputs also documents_filtered, documents_duplicate, documents_quarantined,
    duplicate_rate, bytes_kept, chars_p10/p50/p90/p99 (over every kept document),
    ``filter_rate/<rule>`` and ``language/<code>`` over every cleaned source; with tokenize
    v2 inputs ``tokens`` (packed, summed over sources), unknown_token_rate, byte_fallback_rate.

Not a Beam job: it reads one text column per shard with pyarrow and a few small JSON files, in
place (:class:`tidal.files.step_files.StepFiles`): from a bucket it fetches each documents shard's footer and
``text`` column chunks, ``counts.json``, ``meta.json`` and ``mixture.json``, and nothing else (no
other column, no ``removed.parquet`` / ``quarantine.parquet``, no token shard). Character lengths
need every kept text, so the ``text`` column is read once per shard.

Config (:class:`tidal.data.stats_config.StatsConfig`): clean {src: clean step}, tokenize {src: tokenize step}, mix (mix
step name or null).
Outputs: ``stats.parquet`` (columns source: string, metric: string, value: float64),
``stats.json`` (``[{"source", "metric", "value"}]``, same rows, same order) and ``stats.png``
(tokens, document lengths and document outcomes per source, :mod:`tidal.data.stats_plots`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import tidal.data.jobcli
from tidal.context import StepContext
from tidal.data.mix_sizing import MixtureTable
from tidal.data.shards import DOCUMENTS_PREFIX, shard_names
from tidal.data.stats_config import StatsConfig
from tidal.data.stats_plots import STATS_PNG, write_stats_plot
from tidal.files.step_files import StepFiles

STEP_VERSION = 4  # 3: mixture sizing rows (mixture_epochs, mixture_tokens_unused, ...); 4: stats.png
STATS_PARQUET = "stats.parquet"
STATS_JSON = "stats.json"
ALL = "all"
SCHEMA = pa.schema([("source", pa.string()), ("metric", pa.string()), ("value", pa.float64())])

Row = tuple[str, str, float]


def _rate(part: float, whole: float) -> float:
    return float(part) / float(whole) if whole else 0.0


def read_counts(step: StepFiles | str | Path) -> dict:
    """A clean step's ``counts.json``, checked against ``in = kept + filtered + duplicates +
    quarantined`` (docs/architecture.md section 4).

    Raises:
        FileNotFoundError: no ``counts.json``, naming it.
        ValueError: naming the file, for malformed JSON, a missing key or a broken balance.
    """
    files = StepFiles.open(step)
    path = files.uri_of("counts.json")
    counts = files.read_json("counts.json")
    missing = [
        k for k in ("in", "kept", "filtered", "duplicates", "quarantined") if k not in counts
    ]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    accounted = (
        counts["kept"]
        + sum(counts["filtered"].values())
        + counts["duplicates"]
        + sum(counts["quarantined"].values())
    )
    if accounted != counts["in"]:
        raise ValueError(
            f"{path}: in ({counts['in']}) != kept + filtered + duplicates + quarantined ({accounted})"
        )
    return counts


def document_lengths(step: StepFiles | str | Path) -> tuple[np.ndarray, int]:
    """Character lengths of every kept document (1-D int64, shard order) and their total
    UTF-8 size in bytes, from the ``text`` column of the documents shards (no other column)."""
    files = StepFiles.open(step)
    chars, total_bytes = [], 0
    for name in shard_names(files, DOCUMENTS_PREFIX, "parquet"):
        with files.open_input(name) as source:
            text = pq.read_table(source, columns=["text"]).column("text")
        chars.append(pc.utf8_length(text).to_numpy(zero_copy_only=False).astype(np.int64))
        total_bytes += int(pc.sum(pc.binary_length(text)).as_py() or 0)
    return (np.concatenate(chars) if chars else np.zeros(0, np.int64)), total_bytes


QUANTILES = (10, 50, 90, 99)


def clean_rows(src: str, step: StepFiles | str | Path) -> list[Row]:
    """Rows of one cleaned source (see the module docstring)."""
    counts = read_counts(step)
    return source_rows(src, counts, document_lengths(step))


def source_rows(src: str, counts: dict, lengths: tuple[np.ndarray, int]) -> list[Row]:
    """Rows of one cleaned source from its checked ``counts.json`` (:func:`read_counts`) and its
    :func:`document_lengths` (module docstring)."""
    chars, total_bytes = lengths
    p10, p50, p90, p99 = np.percentile(chars, QUANTILES) if chars.size else (0.0,) * 4
    n_in = counts["in"]
    quarantined = sum(counts["quarantined"].values())
    rows = [
        (src, "documents_in", n_in),
        (src, "documents_kept", counts["kept"]),
        (src, "documents_filtered", sum(counts["filtered"].values())),
        (src, "documents_duplicate", counts["duplicates"]),
        (src, "documents_quarantined", quarantined),
        (src, "quarantine_rate", _rate(quarantined, n_in)),
        (src, "duplicate_rate", _rate(counts["duplicates"], n_in)),
        (src, "bytes_kept", total_bytes),
        (src, "chars_p50", p50),
        (src, "chars_p90", p90),
    ]
    rows += [(src, f"filter_rate/{rule}", _rate(n, n_in)) for rule, n in counts["filtered"].items()]
    rows += [(src, f"quarantine/{reason}", n) for reason, n in counts["quarantined"].items()]
    if "hits" in counts:  # clean v2
        rows += [(src, "chars_p10", p10), (src, "chars_p99", p99)]
        rows += [(src, f"duplicate_rate/{kind}", _rate(n, n_in)) for kind, n in counts["duplicates_by_kind"].items()]
        rows += [(src, f"hit_rate/{rule}", _rate(n, n_in)) for rule, n in counts["hits"].items()]
        rows += [(src, f"language/{lang}", _rate(n, counts["kept"])) for lang, n in counts["languages"].items()]
        rows += [(src, f"repaired/{reason}", n) for reason, n in counts["repaired"].items()]
    return rows


def all_rows(per_source: dict[str, list[Row]], steps: dict[str, StepFiles | str | Path],
             lengths: dict[str, tuple[np.ndarray, int]] | None = None) -> list[Row]:
    """Rows of source ``all`` over the cleaned sources (module docstring).

    Args:
        lengths: :func:`document_lengths` per source if already read (read otherwise).
    """
    values = {src: {m: v for _, m, v in rows} for src, rows in per_source.items()}
    total = {m: sum(v[m] for v in values.values()) for m in
             ("documents_in", "documents_kept", "documents_filtered", "documents_duplicate",
              "documents_quarantined", "bytes_kept")}
    rows = [(ALL, "documents_in", total["documents_in"]), (ALL, "documents_kept", total["documents_kept"]),
            (ALL, "quarantine_rate", _rate(total["documents_quarantined"], total["documents_in"]))]
    if not all("chars_p10" in v for v in values.values()):
        return rows  # clean v1 inputs: the original four rows only
    rows += [(ALL, m, total[m]) for m in ("documents_filtered", "documents_duplicate", "documents_quarantined",
                                           "bytes_kept")]
    rows.append((ALL, "duplicate_rate", _rate(total["documents_duplicate"], total["documents_in"])))
    lengths = lengths or {}
    chars = np.concatenate([(lengths[src] if src in lengths else document_lengths(step))[0]
                            for src, step in steps.items()])
    quantiles = np.percentile(chars, QUANTILES) if chars.size else (0.0,) * len(QUANTILES)
    rows += [(ALL, f"chars_p{q}", value) for q, value in zip(QUANTILES, quantiles, strict=True)]
    filtered: dict[str, float] = {}
    languages: dict[str, float] = {}
    for v in values.values():
        for metric, value in v.items():
            if metric.startswith("filter_rate/"):
                filtered[metric] = filtered.get(metric, 0.0) + value * v["documents_in"]
            elif metric.startswith("language/"):
                languages[metric] = languages.get(metric, 0.0) + value * v["documents_kept"]
    rows += [(ALL, m, _rate(round(n), total["documents_in"])) for m, n in sorted(filtered.items())]
    rows += [(ALL, m, _rate(round(n), total["documents_kept"])) for m, n in sorted(languages.items())]
    return rows


def tokenize_rows(src: str, step: StepFiles | str | Path) -> list[Row]:
    """``tokens`` and ``sequences`` of one tokenized source, from its ``meta.json``."""
    return meta_rows(src, StepFiles.open(step).read_json("meta.json"))


def meta_rows(src: str, meta: dict) -> list[Row]:
    """:func:`tokenize_rows` from the tokenize step's parsed ``meta.json``."""
    rows = [(src, "tokens", meta["n_tokens"]), (src, "sequences", meta["n_sequences"])]
    if "encoded_tokens" in meta:  # tokenize v2
        rows += [(src, "unknown_token_rate", _rate(meta["unknown_tokens"], meta["encoded_tokens"])),
                 (src, "byte_fallback_rate", _rate(meta["byte_fallback_tokens"], meta["encoded_tokens"]))]
    return rows


def mix_rows(step: StepFiles | str | Path, available: dict[str, int] | None = None) -> list[Row]:
    """Per-source mixture rows and ``all/total_tokens``, from ``mixture.json``; with ``available``
    (sequences per source, the tokenize steps' ``n_sequences``) also the sizing rows: per source
    ``mixture_epochs`` and ``mixture_tokens_unused``, and ``all/mixture_tokens_unused`` and
    ``all/mixture_unused_token_fraction`` (over the mixture sources' tokens), computed as the mixture
    table does (:class:`tidal.data.mix_sizing.MixtureTable`). A source missing from ``available``
    gets no sizing row, and ``all`` none either."""
    mixture = StepFiles.open(step).read_json("mixture.json")
    rows = [(ALL, "total_tokens", mixture["n_sequences"] * mixture["seq_len"])]
    if "load_time" in mixture:  # tidal/data/mix_load_time.py recounted its blocks against their stages
        rows.append((ALL, "mixture_stage_counts_exact", int(bool(mixture["load_time"].get("stage_counts_exact")))))
    for src in mixture["sources"]:
        rows += [
            (src, "mixture_weight_requested", mixture["requested"][src]),
            (src, "mixture_weight_realized", mixture["realized"][src]),
            (src, "mixture_sequences", mixture["counts"][src]),
        ]
    available = available or {}
    table = MixtureTable(weights=mixture["requested"], seq_len=mixture["seq_len"], size=mixture.get("size")
                         or {"mode": "smallest_source"}, n_sequences=None,
                         available={s: available.get(s) for s in mixture["sources"]}, taken=mixture["counts"])
    sized = [r for r in table.rows() if r["tokens_unused"] is not None]
    rows += [(r["source"], metric, r[key]) for r in sized
             for metric, key in (("mixture_epochs", "epochs"), ("mixture_tokens_unused", "tokens_unused"))]
    if len(sized) == len(mixture["sources"]):
        rows += [(ALL, "mixture_tokens_unused", sum(r["tokens_unused"] for r in sized)),
                 (ALL, "mixture_unused_token_fraction", table.unused_fraction())]
    return rows


def decontaminate_rows(per_source: dict[str, dict]) -> list[Row]:
    """Rows of the decontaminate steps' ``counts.json`` ``{source: counts}``: per source and for ``all``
    ``documents_contaminated``, ``paragraphs_contaminated``, ``contaminated_rate`` (documents with a
    contaminated paragraph / documents in; 0 when none) and ``contaminated/<eval source>``
    (paragraphs, a count)."""
    rows: list[Row] = []
    total = {"in": 0, "documents_contaminated": 0, "paragraphs_contaminated": 0}
    by_eval: dict[str, int] = {}
    for src, counts in sorted(per_source.items()):
        rows += [(src, "documents_contaminated", counts["documents_contaminated"]),
                 (src, "paragraphs_contaminated", counts["paragraphs_contaminated"]),
                 (src, "contaminated_rate", _rate(counts["documents_contaminated"], counts["in"]))]
        rows += [(src, f"contaminated/{e}", n) for e, n in sorted(counts["by_eval_source"].items())]
        for key in total:
            total[key] += counts[key]
        for e, n in counts["by_eval_source"].items():
            by_eval[e] = by_eval.get(e, 0) + n
    if per_source:
        rows += [(ALL, "documents_contaminated", total["documents_contaminated"]),
                 (ALL, "paragraphs_contaminated", total["paragraphs_contaminated"]),
                 (ALL, "contaminated_rate", _rate(total["documents_contaminated"], total["in"]))]
        rows += [(ALL, f"contaminated/{e}", n) for e, n in sorted(by_eval.items())]
    return rows


def collect_rows(ctx: StepContext) -> list[Row]:
    """Every stats row of the configured inputs, sorted by (source, metric), values float.

    Raises:
        ValueError: if two rows share (source, metric), e.g. a source named ``all``.
    """
    cfg: StatsConfig = ctx.config  # parsed once, at plan time (or by the job command)
    rows: list[Row] = []
    per_source: dict[str, list[Row]] = {}
    clean_steps = {src: ctx.input_files(step) for src, step in sorted(cfg.clean.items())}
    lengths: dict[str, tuple[np.ndarray, int]] = {}
    for src, files in clean_steps.items():
        counts = read_counts(files)  # the balance is checked before any text is read
        lengths[src] = document_lengths(files)  # read once per source, used again by all_rows
        per_source[src] = source_rows(src, counts, lengths[src])
        rows += per_source[src]
    if per_source:
        rows += all_rows(per_source, clean_steps, lengths)
    token_metas = {src: ctx.input_files(step).read_json("meta.json") for src, step in sorted(cfg.tokenize.items())}
    token_rows: list[Row] = []
    for src, meta in token_metas.items():
        token_rows += meta_rows(src, meta)
    rows += token_rows
    by_metric: dict[str, list[float]] = {}
    for _, metric, value in token_rows:
        by_metric.setdefault(metric, []).append(value)
    if (token_rows and "unknown_token_rate" in by_metric
            and len(by_metric["unknown_token_rate"]) == len(by_metric["tokens"])):
        metas = list(token_metas.values())
        encoded = sum(m["encoded_tokens"] for m in metas)
        rows += [(ALL, "tokens", sum(by_metric["tokens"])),
                 (ALL, "unknown_token_rate", _rate(sum(m["unknown_tokens"] for m in metas), encoded)),
                 (ALL, "byte_fallback_rate", _rate(sum(m["byte_fallback_tokens"] for m in metas), encoded))]
    rows += decontaminate_rows({src: ctx.input_files(step).read_json("counts.json")
                                for src, step in sorted(cfg.decontaminate.items())})
    if cfg.mix:
        rows += mix_rows(ctx.input_files(cfg.mix), {src: meta["n_sequences"] for src, meta in token_metas.items()})
    rows = sorted((str(s), str(m), float(v)) for s, m, v in rows)
    keys = [(s, m) for s, m, _ in rows]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(
            f"step {ctx.name}: duplicate stats rows {duplicates} (is a source named {ALL!r}?)"
        )
    return rows


def run(ctx: StepContext) -> dict:
    """Write ``stats.parquet``, ``stats.json`` and ``stats.png``; return ``{"rows": n}`` plus the ``all`` rows."""
    rows = collect_rows(ctx)
    table = pa.table(
        {
            "source": [r[0] for r in rows],
            "metric": [r[1] for r in rows],
            "value": [r[2] for r in rows],
        },
        schema=SCHEMA,
    )
    pq.write_table(table, ctx.out_dir / STATS_PARQUET)
    as_json = [{"source": s, "metric": m, "value": v} for s, m, v in rows]
    (ctx.out_dir / STATS_JSON).write_text(json.dumps(as_json, indent=1, allow_nan=False) + "\n")
    write_stats_plot(rows, ctx.out_dir / STATS_PNG, all_name=ALL)
    return {"rows": len(rows), **{f"{ALL}/{m}": v for s, m, v in rows if s == ALL}}


if __name__ == "__main__":
    tidal.data.jobcli.main(sys.modules[__name__], "stats")
