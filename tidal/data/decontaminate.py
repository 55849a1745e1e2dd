"""The ``decontaminate`` step kind: remove training text that overlaps the eval sources, by exact n-grams.

Method: GPT-3's n-gram decontamination (Brown et al. 2020, "Language Models are Few-Shot Learners",
appendix C: 13-gram overlap between training and benchmark text), as datatrove's ``decont`` module
(``NGramsDecontIndexer`` / ``NGramsDecontFilter``) runs it: an index of every n-gram of the eval
text, then each training document checked against it. Here the unit checked is a *paragraph*.

Definitions (the invariant: the output is a pure function of the input documents, the eval sources'
documents and the config; not of shard counts, batch sizes or the order of the eval shards):

* **Paragraph**: a line of the document that holds a non-whitespace character (split on ``"\\n"``:
  the clean step normalizes newlines; UDHR writes one paragraph a line, Brown one a line with blank
  lines between).
* **Words**: :func:`tidal.data.filters.words` of :func:`tidal.data.neardup.fold_text`, the near-dup
  shingles' units: NFKC, case-folded, punctuation and symbols removed, whitespace-separated, and every
  CJK character a word of its own (so for Chinese an n-gram is ``n`` characters).
* **n-gram**: ``n`` consecutive words of one paragraph (training side) or of a whole eval document
  (index side), hashed to 64 bits (:func:`tidal.data.minhash.window_hashes` over BLAKE2b word
  hashes). Exact up to a 64-bit hash collision: with ``m`` indexed and ``q`` checked n-grams about
  ``m * q / 2^64`` false matches are expected (5e-6 for a million indexed and a hundred million checked).
* **Share** of a paragraph: its n-grams found in the index / its n-grams. A paragraph with fewer
  than ``n`` words has no n-gram and is never contaminated ("...", "A.", "##"); a paragraph is
  **contaminated** when at least one of its n-grams is found and the share is ``>= threshold``
  (threshold 0: any one n-gram, GPT-3's rule). Its **eval source** is the one whose own index holds
  most of its n-grams (ties: the first name in sorted order).

With ``remove: paragraph`` the contaminated paragraphs are cut out (with the blank lines after them)
and a document left without a paragraph is removed; with ``remove: document`` a document with any
contaminated paragraph is removed whole. A kept document keeps the clean step's ``id`` (its
identity: the held-out split and the shard it lives in are functions of it), even when a paragraph
was cut (its text then no longer hashes to it).

Not a Beam job (as ``stats`` and ``mix``): one pass over each input shard with pyarrow, a batch of
:data:`BATCH_ROWS` documents at a time; the index (sorted ``uint64`` arrays, 8 bytes an eval n-gram)
is held in memory.

Outputs (in ``out_dir``):

* ``documents-SSSSS-of-NNNNN.parquet``: the clean step's shards, same names and count, same columns
  (:data:`tidal.data.shards.DOCUMENT_SCHEMA`), same order (by ``id``): what the tokenize step reads.
* ``removed.parquet``: ``ref``, ``outcome`` (``paragraph`` | ``document``), ``reason``
  (``contaminated``), ``eval_source``, ``share``, ``paragraph`` (0-based index among the document's
  paragraphs; for a removed document its first contaminated one), ``fields``; sorted by ref, then
  outcome, then paragraph. A document every paragraph of which was cut has its paragraph rows and a
  document row.
* ``counts.json``: ``in``, ``kept``, ``documents_removed``, ``documents_contaminated`` (with at least
  one contaminated paragraph), ``paragraphs``, ``paragraphs_checked`` (with at least ``n`` words),
  ``paragraphs_contaminated``, ``paragraphs_removed``, ``chars_removed``, ``by_eval_source`` {eval
  source: contaminated paragraphs}, ``index_ngrams`` {eval source: distinct n-grams}, ``n``,
  ``threshold``, ``remove``. The step fails unless ``in = kept + documents_removed`` and the files
  hold the rows it counts (:func:`check_outputs`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidal.context import StepContext
from tidal.data.decontaminate_config import DecontaminateConfig
from tidal.data.eval_tasks import task_texts
from tidal.data.fetch import write_parquet, write_parquet_chunks
from tidal.data.filters import words
from tidal.data.heldout import is_heldout
from tidal.data.minhash import window_hashes, word_hash
from tidal.data.neardup import fold_text
from tidal.data.shards import DOCUMENT_SCHEMA, DOCUMENTS_PREFIX, shard_names
from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles

STEP_VERSION = 1
COUNTS_FILE = "counts.json"
REMOVED_FILE = "removed.parquet"
REASON = "contaminated"
TASK_SOURCE_PREFIX = "task:"  # a downstream eval task's eval source name: task:<task>
BATCH_ROWS = 2048
REMOVED_SCHEMA = pa.schema([("ref", pa.string()), ("outcome", pa.string()), ("reason", pa.string()),
                            ("eval_source", pa.string()), ("share", pa.float64()), ("paragraph", pa.int64()),
                            ("fields", pa.string())])


def paragraph_words(text: str) -> list[tuple[int, list[str]]]:
    """The paragraphs of ``text`` (module docstring) as ``(line index, words)``, in order.

    The text is folded once: folding keeps every newline (it removes no whitespace), so line ``i`` of
    the folded text is the folding of line ``i``.
    """
    lines = text.split("\n")
    folded = fold_text(text).split("\n")
    if len(folded) != len(lines):  # not expected (NFKC maps no character to a newline): fold line by line
        folded = [fold_text(line) for line in lines]
    return [(i, words(f)) for i, (line, f) in enumerate(zip(lines, folded, strict=True)) if line.strip()]


def ngram_hashes(word_lists: Iterable[list[str]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit n-gram hashes of each word list (a paragraph, or a whole eval document).

    Returns:
        ``(hashes, counts)``: ``hashes`` 1-D ``uint64`` of every list's n-grams in list order,
        ``counts`` 1-D ``int64`` n-grams per list (``max(0, len - n + 1)``: none below ``n`` words).
    """
    flat: list[str] = []  # the words of every list of n words or more, hashed in one pass
    sizes = []
    for ws in word_lists:
        sizes.append(len(ws) if len(ws) >= n else 0)
        if len(ws) >= n:
            flat += ws
    lengths = np.asarray(sizes, dtype=np.int64)
    counts = np.where(lengths > 0, lengths - n + 1, 0)
    if not flat:
        return np.zeros(0, dtype=np.uint64), counts
    hashed = {word: word_hash(word) for word in set(flat)}
    w = np.fromiter(map(hashed.__getitem__, flat), dtype=np.uint64, count=len(flat))
    windows = window_hashes(w, n)  # every window of the concatenation; keep those inside one list
    long = lengths[lengths > 0]
    starts = np.concatenate([[0], np.cumsum(long)[:-1]])
    offsets = np.concatenate([[0], np.cumsum(long - n + 1)[:-1]])
    slot = np.arange(int((long - n + 1).sum()), dtype=np.int64)
    return windows[slot + np.repeat(starts - offsets, long - n + 1)], counts


def distinct(hashes: np.ndarray) -> np.ndarray:
    """The sorted distinct values of 1-D ``uint64`` ``hashes`` (by sorting: numpy 2's hash-based
    ``np.unique`` took 5.7 s on UDHR's 0.9 million 13-grams, a sort 0.1 s)."""
    out = np.sort(hashes)
    return out[np.concatenate([[True], out[1:] != out[:-1]])] if out.size else out


def build_index(texts: Iterable[str], n: int) -> np.ndarray:
    """The sorted distinct n-gram hashes (1-D ``uint64``) of ``texts``, each text's words taken whole."""
    parts = []
    batch: list[list[str]] = []
    for text in texts:
        batch.append(words(fold_text(text or "")))
        if len(batch) >= BATCH_ROWS:
            parts.append(distinct(ngram_hashes(batch, n)[0]))
            batch = []
    parts.append(distinct(ngram_hashes(batch, n)[0]))
    return distinct(np.concatenate(parts))


def contains(index: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Boolean mask: which of ``hashes`` are in the sorted ``index``."""
    if index.size == 0:
        return np.zeros(hashes.shape, dtype=bool)
    at = np.minimum(np.searchsorted(index, hashes), index.size - 1)
    return index[at] == hashes


class Index:
    """The eval sources' n-gram index: one sorted hash array per source and their union."""

    def __init__(self, by_source: dict[str, np.ndarray]):
        self.by_source = dict(sorted(by_source.items()))
        parts = list(self.by_source.values())
        self.union = distinct(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.uint64)

    def sizes(self) -> dict[str, int]:
        """Distinct n-grams per eval source."""
        return {src: int(a.size) for src, a in self.by_source.items()}

    def best_source(self, hashes: np.ndarray) -> str:
        """The eval source whose index holds most of ``hashes`` (ties: first in sorted order)."""
        found = {src: int(contains(a, hashes).sum()) for src, a in self.by_source.items()}
        most = max(found.values())
        return next(src for src, hits in found.items() if hits == most)


def mark(docs: list[str], index: Index, n: int,
         threshold: float) -> tuple[list[list[tuple[int, list[str]]]], list[list[tuple[int, int, float, str]]]]:
    """The paragraphs of each document of ``docs`` and its contaminated ones (module docstring).

    Returns:
        ``(paragraphs, marked)``: per document, :func:`paragraph_words`, and ``[(paragraph number, line
        index, share, eval source)]`` of its contaminated paragraphs.
    """
    paragraphs = [paragraph_words(text or "") for text in docs]
    flat = [ws for paras in paragraphs for _, ws in paras]
    hashes, counts = ngram_hashes(flat, n)
    found = contains(index.union, hashes)
    hits = np.bincount(np.repeat(np.arange(len(flat)), counts), weights=found, minlength=len(flat))
    bounds = np.concatenate([[0], np.cumsum(counts)])
    share = Fraction(repr(float(threshold)))  # compared exactly: 17 of 20 n-grams is a share of 0.85
    marked: list[list[tuple[int, int, float, str]]] = []
    k = 0
    for paras in paragraphs:
        marks = []
        for number, (line, _) in enumerate(paras):
            c, h = int(counts[k]), int(hits[k])
            if h > 0 and h * share.denominator >= share.numerator * c:
                marks.append((number, line, h / c, index.best_source(hashes[bounds[k]:bounds[k + 1]])))
            k += 1
        marked.append(marks)
    return paragraphs, marked


def cut(text: str, lines: set[int]) -> str:
    """``text`` without the lines ``lines`` and the blank lines after each; trailing blank lines dropped."""
    out, skip_blank = [], False
    for i, line in enumerate(text.split("\n")):
        if i in lines:
            skip_blank = True
            continue
        if skip_blank and not line.strip():
            continue
        skip_blank = False
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)


def new_counts(cfg: DecontaminateConfig, index: Index) -> dict[str, Any]:
    """``counts.json`` before any document: every count 0, the index sizes and the settings."""
    return {"in": 0, "kept": 0, "documents_removed": 0, "documents_contaminated": 0, "paragraphs": 0,
            "paragraphs_checked": 0, "paragraphs_contaminated": 0, "paragraphs_removed": 0, "chars_removed": 0,
            "by_eval_source": dict.fromkeys(index.by_source, 0), "index_ngrams": index.sizes(),
            "n": cfg.n, "threshold": cfg.threshold, "remove": cfg.remove,
            **({"heldout_unchecked": 0} if cfg.heldout is not None else {})}


def decontaminate_batch(batch: dict[str, list], index: Index, cfg: DecontaminateConfig, counts: dict[str, Any],
                        removed: list[dict[str, Any]]) -> pa.Table:
    """One batch of documents (``DOCUMENT_SCHEMA`` columns as lists) -> the kept documents' table;
    adds to ``counts`` and appends the removed rows to ``removed``."""
    held = ([is_heldout(doc_id, cfg.heldout) for doc_id in batch["id"]] if cfg.heldout is not None
            else [False] * len(batch["text"]))
    texts = batch["text"]
    paragraphs, marks = mark(["" if h else text for h, text in zip(held, texts, strict=True)], index, cfg.n,
                             cfg.threshold)
    keep, new_texts = [], []
    for row, (text, paras, marked) in enumerate(zip(texts, paragraphs, marks, strict=True)):
        text = text or ""
        counts["in"] += 1
        if held[row]:  # a held-out document is not training text: passed on as it is
            counts["heldout_unchecked"] += 1
            keep.append(row)
            new_texts.append(text)
            continue
        counts["paragraphs"] += len(paras)
        counts["paragraphs_checked"] += sum(len(ws) >= cfg.n for _, ws in paras)
        counts["paragraphs_contaminated"] += len(marked)
        for *_, src in marked:
            counts["by_eval_source"][src] += 1
        base = {"ref": batch["ref"][row], "reason": REASON, "fields": batch["fields"][row]}
        if not marked:
            keep.append(row)
            new_texts.append(text)
            continue
        counts["documents_contaminated"] += 1
        result = "" if cfg.remove == "document" else cut(text, {line for _, line, _, _ in marked})
        if cfg.remove == "paragraph":
            counts["paragraphs_removed"] += len(marked)
            removed += [{**base, "outcome": "paragraph", "eval_source": src, "share": share, "paragraph": number}
                        for number, _, share, src in marked]
        if result.strip():
            keep.append(row)
            new_texts.append(result)
            counts["chars_removed"] += len(text) - len(result)
            continue
        number, _, share, src = marked[0]
        removed.append({**base, "outcome": "document", "eval_source": src, "share": share, "paragraph": number})
        counts["documents_removed"] += 1
        counts["chars_removed"] += len(text)
    counts["kept"] += len(keep)
    columns = {name: [batch[name][i] for i in keep] for name in DOCUMENT_SCHEMA.names}
    columns["text"] = new_texts
    return pa.table(columns, schema=DOCUMENT_SCHEMA)


def _batches(files: StepFiles, name: str) -> Iterator[dict[str, list]]:
    with files.open_input(name) as source:
        for record_batch in pq.ParquetFile(source).iter_batches(batch_size=BATCH_ROWS, columns=DOCUMENT_SCHEMA.names):
            yield record_batch.to_pydict()


def eval_index(steps: dict[str, StepFiles], n: int, tasks: dict[str, str] | None = None) -> Index:
    """The index of the eval sources' clean steps ``{source: step files}`` (every document shard) and
    of the downstream eval tasks' items ``{task: definition sha256}``, each item a document of eval
    source ``task:<name>`` (:func:`tidal.data.eval_tasks.task_texts`; a task edited since planning raises
    ValueError)."""
    by_source = {}
    for src, files in sorted(steps.items()):
        texts = (text for name in shard_names(files, DOCUMENTS_PREFIX, "parquet")
                 for batch in _batches(files, name) for text in batch["text"])
        by_source[src] = build_index(texts, n)
    for task, digest in sorted((tasks or {}).items()):
        by_source[f"{TASK_SOURCE_PREFIX}{task}"] = build_index(task_texts(task, digest), n)
    return Index(by_source)


def decontaminate(documents: StepFiles, index: Index, cfg: DecontaminateConfig, out: OutputDir) -> dict[str, Any]:
    """Check every document shard of ``documents`` against ``index`` and write the outputs into ``out``.

    Returns:
        The ``counts.json`` structure (also written).
    """
    counts = new_counts(cfg, index)
    removed: list[dict[str, Any]] = []
    for name in shard_names(documents, DOCUMENTS_PREFIX, "parquet"):
        tables = (decontaminate_batch(batch, index, cfg, counts, removed) for batch in _batches(documents, name))
        with out.file(name) as path:
            write_parquet_chunks(tables, DOCUMENT_SCHEMA, path)
    removed.sort(key=lambda r: (r["ref"] or "", r["outcome"], r["paragraph"]))
    with out.file(REMOVED_FILE) as path:
        write_parquet(pa.Table.from_pylist(removed, schema=REMOVED_SCHEMA), path)
    out.write_text(COUNTS_FILE, json.dumps(counts, indent=1, sort_keys=True) + "\n")
    return counts


def run(ctx: StepContext) -> dict:
    """Index the eval sources' clean steps, decontaminate the input clean step (module docstring).

    Returns:
        :func:`summarize`'s flat summary (logged to MLflow as the step's metrics).

    Raises:
        KeyError: an input step that is not an input.
    """
    cfg: DecontaminateConfig = ctx.config  # parsed once, at plan time (or by the job command)
    index = eval_index({src: ctx.input_files(step) for src, step in cfg.eval.items()}, cfg.n, cfg.eval_tasks)
    out = ctx.output()
    decontaminate(ctx.input_files(cfg.input), index, cfg, out)
    summary = summarize(cfg, out.location)
    ctx.log.info("decontaminate %s against %s: %s", cfg.source, sorted(index.by_source), summary)
    return summary


def summarize(config: DecontaminateConfig, out_dir: str | Path) -> dict:
    """The flat summary of a finished run's ``counts.json``: every count, ``contaminated_<eval source>``
    and ``index_ngrams_<eval source>``."""
    counts = StepFiles.open(out_dir).read_json(COUNTS_FILE)
    flat = {k: v for k, v in counts.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    flat |= {f"contaminated_{src}": v for src, v in counts["by_eval_source"].items()}
    flat |= {f"index_ngrams_{src}": v for src, v in counts["index_ngrams"].items()}
    return flat


def expected_outputs(config: DecontaminateConfig) -> list[str]:
    """The files a finished run writes besides the document shards (whose count is the input's):
    ``counts.json`` and ``removed.parquet``."""
    return [COUNTS_FILE, REMOVED_FILE]


def check_outputs(config: DecontaminateConfig, out_dir: str | Path) -> None:
    """Before a commit: ``in = kept + documents_removed``, the shards hold ``kept`` rows and
    ``removed.parquet`` ``paragraphs_removed`` paragraph rows and ``documents_removed`` document rows.

    Raises:
        ValueError: naming the file and both numbers on a mismatch.
    """
    files = StepFiles.open(out_dir)
    counts = files.read_json(COUNTS_FILE)
    if counts["in"] != counts["kept"] + counts["documents_removed"]:
        raise ValueError(f"{files.uri}/{COUNTS_FILE}: in={counts['in']} but kept={counts['kept']} + "
                         f"documents_removed={counts['documents_removed']}")
    kept = 0
    for name in shard_names(files, DOCUMENTS_PREFIX, "parquet"):
        with files.open_input(name) as source:
            kept += pq.read_metadata(source).num_rows
    with files.open_input(REMOVED_FILE) as source:
        outcomes = pq.read_table(source, columns=["outcome"]).column("outcome").to_pylist()
    for what, found, expected in (("documents shards", kept, counts["kept"]),
                                  (f"{REMOVED_FILE} paragraph rows", outcomes.count("paragraph"),
                                   counts["paragraphs_removed"]),
                                  (f"{REMOVED_FILE} document rows", outcomes.count("document"),
                                   counts["documents_removed"])):
        if found != expected:
            raise ValueError(f"{files.uri}: {what} hold {found} but {COUNTS_FILE} says {expected}")
