"""Tokenize step: encode cleaned documents and pack them into fixed-length sequences.

Invariant: the token stream is the documents in ascending ``id`` order, each followed by
exactly one end-of-text id, cut into ``seq_len``-token sequences; nothing else decides it.
Encoding runs as a Beam pipeline (DirectRunner by default; any runner by setting
``TIDAL_BEAM_ARGS``, which is not part of the config because runners never change the
bytes) and may happen on any worker in any order; the packer then sorts by ``id`` before
concatenating, so the shards are byte-identical across runners and worker counts.

Policies:
    * Special-token text inside a document (a literal ``<|endoftext|>``) is encoded as
      ordinary text (``Tokenizer.encode_special_tokens = True``, see
      :func:`tidal.data.tokenizer.load`): only the packer emits the end-of-text id, so a
      document can never fake a document boundary.
    * A document that fails to encode (``tokenizers`` raises ``TypeError`` on a lone
      surrogate, DATA.md) is not packed, but counted in ``documents_failed`` and listed
      with its error in ``failed_documents.json``: reported, never silently dropped.
    * The trailing partial sequence is dropped; its length is ``tokens_dropped_tail``.
    * Unknown and byte-fallback tokens are counted over every encoded token (end-of-text
      ids excluded): ``unknown_tokens`` are the model's ``unk_token`` (a byte-level BPE has
      none), ``byte_fallback_tokens`` are single-byte tokens of a non-ASCII byte (a byte-level
      BPE's ``ByteLevel`` alphabet symbols of bytes 0x80-0xFF, or SentencePiece-style
      ``<0xAB>`` tokens): text no merge covered, e.g. a CJK character spelled as 3 bytes.
      Their rates over ``encoded_tokens`` go into the stats.

Packing streams (:mod:`tidal.data.token_spill`): each document shard is encoded into a
token spill by one worker; each output ``.npy`` shard is then written by one worker, which merges
the spills in id order from the id range where its rows begin (:mod:`tidal.data.token_writers`).
No worker holds more than one encode batch, or a read buffer per spill and a chunk of rows; what
meets in one place is one small summary per input shard.

Config (:class:`tidal.data.tokenize_config.TokenizeConfig`): source, input (clean step name),
tokenizer (tokenizer step name), seq_len (tokens), shards (output ``.npy`` count).
Outputs: ``tokens-00000-of-0000N.npy`` ``[n_seq, seq_len]`` (uint16 / uint32, see
:func:`tidal.data.shards.token_dtype`), ``meta.json``
``{tokenizer_hash, seq_len, dtype, n_sequences, n_tokens (= n_sequences * seq_len, the
packed tokens), n_documents (encoded), vocab_size, tokens_dropped_tail, documents_failed,
encoded_tokens, unknown_tokens, byte_fallback_tokens}``,
and ``failed_documents.json`` (``[{"id", "error"}]``, sorted by id; always written).
With ``heldout`` (:class:`tidal.data.heldout.HeldoutSplit`) the held-out documents are packed
apart, by the same rules, into ``heldout-tokens-00000-of-00001.npy`` with ``heldout-meta.json``
(the same keys, for that part, plus ``heldout``) and ``heldout-documents.json`` (their ids,
sorted); ``meta.json`` then describes the training part only and adds ``heldout_documents`` and
``heldout_sequences``. A split that packs into no sequence fails the step (raise the fraction).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
from tokenizers import Tokenizer

import tidal.data.jobcli
from tidal.context import StepContext
from tidal.data import tokenizer as tokenizer_step
from tidal.data.beam_options import beam_options, create_spread
from tidal.data.heldout import HELDOUT_PREFIX, HeldoutSplit, is_heldout
from tidal.data.shards import (
    DOCUMENTS_PREFIX,
    META_NAME,
    TOKENS_PREFIX,
    iter_shard_rows,
    shard_name,
    shard_names,
    token_dtype,
)
from tidal.data.token_spill import encode_shard, read_ids
from tidal.data.token_writers import plan_writes, write_shard
from tidal.data.tokenize_config import TokenizeConfig
from tidal.files.output import OutputDir
from tidal.files.step_files import StepFiles

STEP_VERSION = 2
FAILED_FILE = "failed_documents.json"
HELDOUT_META = f"{HELDOUT_PREFIX}{META_NAME}"  # the held-out split's meta.json (same keys, plus "heldout")
HELDOUT_TOKENS = shard_name(f"{HELDOUT_PREFIX}{TOKENS_PREFIX}", 0, 1, "npy")  # one shard, whatever `shards`
HELDOUT_DOCUMENTS = f"{HELDOUT_PREFIX}documents.json"  # the held-out document ids, sorted
ENCODE_BATCH_DOCUMENTS = 256
ENCODE_BATCH_CHARS = 1 << 18  # characters per encode batch (see encode_batches; CJK: ~3 tokens a character)
ID_DTYPE = np.uint32  # token ids of encoded documents in the spills


def encode_documents(
    tokenizer: Tokenizer, documents: Sequence[tuple[str, str]], eos_id: int
) -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, str]]]:
    """Encode ``(id, text)`` documents, appending one ``eos_id`` to each.

    Uses ``encode_batch_fast`` (ids without character offsets, about twice as fast as
    ``encode_batch`` here). A batch fails as a whole when one text cannot be encoded, so on
    failure every document of the batch is retried alone to find the culprits.

    Returns:
        ``(encoded, failed)``: ``encoded`` is ``[(id, ids)]`` with ``ids`` a 1-D ``uint32``
        array of ``len(tokens) + 1`` tokens; ``failed`` is ``[(id, "ExcType: message")]``.
    """
    texts = [text for _, text in documents]
    try:
        encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)  # no offsets: ~2x
    except Exception:  # noqa: BLE001 - isolate the failing documents below
        encodings = None
    encoded, failed = [], []
    for index, (doc_id, text) in enumerate(documents):
        if encodings is not None:
            ids = encodings[index].ids
        else:
            try:
                ids = tokenizer.encode(text, add_special_tokens=False).ids
            except Exception as err:  # noqa: BLE001 - reported per document
                failed.append((doc_id, f"{type(err).__name__}: {err}"))
                continue
        array = np.empty(len(ids) + 1, dtype=ID_DTYPE)
        array[:-1] = ids
        array[-1] = eos_id
        encoded.append((doc_id, array))
    return encoded, failed


def pack_sequences(
    documents: Iterable[np.ndarray], seq_len: int, dtype: np.dtype
) -> tuple[np.ndarray, int]:
    """Concatenate token arrays (in the given order) and cut into ``seq_len``-token rows.

    Returns:
        ``(sequences, tokens_dropped_tail)``: ``sequences`` is ``[floor(total / seq_len),
        seq_len]`` of ``dtype``; the remaining ``total % seq_len`` tokens are dropped.

    Raises:
        ValueError: if ``seq_len`` < 1 or an id does not fit in ``dtype``.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    parts = list(documents)
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=ID_DTYPE)
    if stream.size and int(stream.max()) > np.iinfo(dtype).max:
        raise ValueError(f"token id {int(stream.max())} does not fit in {np.dtype(dtype).name}")
    n_sequences = stream.size // seq_len
    packed = stream[: n_sequences * seq_len].astype(dtype).reshape(n_sequences, seq_len)
    return packed, int(stream.size - packed.size)


def _byte_level_symbols() -> dict[int, str]:
    """GPT-2's byte -> printable symbol table (Radford et al. 2019, ``bytes_to_unicode`` in
    openai/gpt-2 ``encoder.py``), which the ``ByteLevel`` pre-tokenizer uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return symbols


def special_token_ids(tokenizer: Tokenizer) -> tuple[list[int], int | None]:
    """``(byte-fallback ids, unknown id or None)`` of ``tokenizer`` (module docstring).

    Byte-fallback ids: the ``ByteLevel`` symbols of bytes 0x80-0xFF when the tokenizer uses
    a ByteLevel pre-tokenizer, plus any ``<0xAB>`` token; sorted.
    """
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in vocab if len(t) == 6 and t.startswith("<0x") and t.endswith(">")}
    if '"ByteLevel"' in tokenizer.to_str():
        symbols = _byte_level_symbols()
        ids |= {vocab[symbols[b]] for b in range(0x80, 0x100) if symbols[b] in vocab}
    unk = getattr(tokenizer.model, "unk_token", None)
    return sorted(ids), (vocab.get(unk) if unk else None)


def encode_batches(path: str | Path, max_documents: int = ENCODE_BATCH_DOCUMENTS,
                   max_chars: int = ENCODE_BATCH_CHARS,
                   keep: Callable[[str], bool] | None = None) -> Iterator[list[tuple[str, str]]]:
    """``(id, text)`` batches of a document shard in id order, each of at most ``max_documents``
    documents and, unless one document alone is longer, ``max_chars`` characters. ``path`` is the
    shard's location, a local path or a bucket URI; only its ``id`` and ``text`` columns are read,
    in place (:func:`tidal.data.shards.iter_shard_rows`). With ``keep``, only the documents whose
    id it accepts (one side of the held-out split).

    ``tokenizers`` keeps about 100 bytes per token of a batch's encodings (ids, tokens,
    offsets, masks) until the batch is done, so the character bound, not the document count,
    is what keeps a worker's memory flat when documents are long.
    """
    batch: list[tuple[str, str]] = []
    chars = 0
    for rows in iter_shard_rows(path, ("id", "text"), max_documents):
        for doc_id, text in rows:
            if keep is not None and not keep(doc_id):
                continue
            size = len(text) if isinstance(text, str) else 0  # a null text fails in encode_documents, reported
            if batch and (len(batch) >= max_documents or chars + size > max_chars):
                yield batch
                batch, chars = [], 0
            batch.append((doc_id, text))
            chars += size
    if batch:
        yield batch


class EncodeShardFn(beam.DoFn):
    """Beam DoFn: ``(shard number, [document shard location])`` (as
    :func:`tidal.data.beam_options.create_spread` gives them) -> that shard's token spill summary
    (:func:`tidal.data.token_spill.encode_shard`), a small record (counts per id range) from which
    the output shards' writers are planned. Loads the tokenizer once per worker. With a held-out split
    (:mod:`tidal.data.heldout`) a shard gives two summaries, ``part`` ``train`` and ``heldout``
    (the held-out spill goes to ``spill``'s ``heldout`` child).

    Locations are what the committed steps' ``StepContext.inputs`` name: bucket URIs on an
    object-store root, so a worker on another machine reads the shards and the tokenizer in place
    (``tokenizer_dir`` is the tokenizer step's location too)."""

    def __init__(self, tokenizer_dir: str, eos_id: int, spill: OutputDir, fallback_ids: list[int], unk_id: int | None,
                 heldout: HeldoutSplit | None = None, dtype: str = "uint32"):
        self.heldout = heldout
        self.dtype = np.dtype(dtype)  # the output shards' token dtype: spills in it are half the bytes
        self.tokenizer_dir = tokenizer_dir
        self.eos_id = eos_id
        self.spill = spill
        self.fallback_ids = fallback_ids
        self.unk_id = unk_id
        self.tokenizer: Tokenizer | None = None

    def setup(self) -> None:
        self.tokenizer, _ = tokenizer_step.load(self.tokenizer_dir)

    def process(self, element: tuple[int, Iterable[str]]):
        index, paths = element
        split = self.heldout
        parts = [("train", None, self.spill)] if split is None else [
            ("train", lambda doc_id: not is_heldout(doc_id, split), self.spill),
            ("heldout", lambda doc_id: is_heldout(doc_id, split), self.spill.child("heldout"))]
        for path in paths:
            for part, keep, spill in parts:
                batches = (encode_documents(self.tokenizer, batch, self.eos_id)
                           for batch in encode_batches(path, keep=keep))
                yield {**encode_shard(index, path, spill, batches, self.fallback_ids, self.unk_id, self.dtype),
                       "part": part}


def plan_parts(spills: list[dict[str, Any]], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The write tasks of every part (:func:`tidal.data.token_writers.plan_writes`): the training part's
    ``shards`` shards and, with a held-out split, its one shard; each task names its ``part``."""
    names = [shard_name(TOKENS_PREFIX, k, settings["shards"], "npy") for k in range(settings["shards"])]
    parts = [("train", names)] + ([("heldout", [HELDOUT_TOKENS])] if settings.get("heldout") is not None else [])
    return [{**task, "part": part}
            for part, part_names in parts
            for task in plan_writes([s for s in spills if s.get("part", "train") == part], part_names,
                                    settings["seq_len"])]


def write_part_shard(task: dict[str, Any], out: OutputDir, settings: dict[str, Any]) -> dict[str, Any]:
    """Write one task's shard (:func:`tidal.data.token_writers.write_shard`); ``{"name", "rows", "part"}``."""
    return {**write_shard(task, out, settings["seq_len"], token_dtype(settings["vocab_size"])), "part": task["part"]}


def finish(spills: list[dict[str, Any]], written: list[dict[str, Any]], out: OutputDir, settings: dict[str, Any],
           spill: OutputDir) -> None:
    """The last stage, once every shard is written: ``failed_documents.json``, ``meta.json`` (and the
    held-out files) from the spills' summaries and the writers' row counts, then the ``spill`` files
    removed.

    The spills are removed here, inside the job, not only by :func:`run` after it: a job
    that a Beam provider launched on a cluster is committed when the job ends (see
    :mod:`tidal.core.beam_job`), whether or not the launching process got to clean up.
    """
    spills = sorted(spills, key=lambda s: s["index"])
    failures = [{"id": doc_id, "error": error} for doc_id, error in sorted(f for s in spills for f in s["failed"])]
    out.write_text(FAILED_FILE, json.dumps(failures, indent=1, ensure_ascii=False) + "\n")
    train = [s for s in spills if s.get("part", "train") == "train"]
    meta = {**_part_meta(train, written, "train", settings), "documents_failed": len(failures)}
    if settings.get("heldout") is not None:
        held = [s for s in spills if s.get("part") == "heldout"]
        held_meta = _part_meta(held, written, "heldout", settings)
        ids = sorted(doc_id for s in held for doc_id in read_ids(s))
        out.write_text(HELDOUT_DOCUMENTS, json.dumps(ids, indent=0) + "\n")
        out.write_text(HELDOUT_META, json.dumps({**held_meta, "heldout": settings["heldout"].model_dump()},
                                                indent=1, sort_keys=True) + "\n")
        meta |= {"heldout_documents": held_meta["n_documents"], "heldout_sequences": held_meta["n_sequences"]}
    out.write_text(META_NAME, json.dumps(meta, indent=1, sort_keys=True) + "\n")
    spill.remove()


def _merge_and_write(spills: list[dict[str, Any]], out: OutputDir, settings: dict[str, Any], spill: OutputDir) -> None:
    """Plan, every shard's write and :func:`finish`, one after another in this process (what the job's
    stages do on their workers)."""
    written = [write_part_shard(task, out, settings) for task in plan_parts(spills, settings)]
    finish(spills, written, out, settings, spill)


def _part_meta(spills: list[dict[str, Any]], written: list[dict[str, Any]], part: str,
               settings: dict[str, Any]) -> dict:
    """One part's ``meta.json`` fields (all but ``documents_failed``), from its spills' summaries and its
    shards' row counts."""
    n_sequences = sum(w["rows"] for w in written if w["part"] == part)
    stream_tokens = sum(s["stream_tokens"] for s in spills)
    return {
        "tokenizer_hash": settings["tokenizer_hash"],
        "seq_len": settings["seq_len"],
        "dtype": token_dtype(settings["vocab_size"]).name,
        "n_sequences": n_sequences,
        "n_tokens": n_sequences * settings["seq_len"],
        "n_documents": sum(s["documents"] for s in spills),
        "vocab_size": settings["vocab_size"],
        "tokens_dropped_tail": stream_tokens - n_sequences * settings["seq_len"],
        "encoded_tokens": sum(s["encoded_tokens"] for s in spills),
        "unknown_tokens": sum(s["unknown_tokens"] for s in spills),
        "byte_fallback_tokens": sum(s["byte_fallback_tokens"] for s in spills),
    }


def _finish(_, spills, written, out: OutputDir, settings: dict[str, Any], spill: OutputDir) -> None:
    finish(list(spills), list(written), out, settings, spill)


def build_pipeline(pipeline: beam.Pipeline, paths: list[str], tokenizer_dir: str, eos_id: int,
                   special: tuple[list[int], int | None], settings: dict[str, Any], out: OutputDir,
                   spill: OutputDir) -> None:
    """Add the tokenize transforms to ``pipeline``: encode the document shards at ``paths`` (read in
    place) with the tokenizer at ``tokenizer_dir`` into token spills under ``spill``; plan the output
    shards from the spills' summaries (small records: counts per id range); write each output shard on
    the worker that gets its task, into ``out`` (a local directory or the attempt's staging prefix in the
    bucket); then one last element writes ``meta.json`` and removes the spills. ``special`` is
    :func:`special_token_ids`' ``(byte-fallback ids, unknown id)``; ``settings`` holds ``seq_len``,
    ``shards``, ``vocab_size``, ``tokenizer_hash`` and ``heldout`` (the step config's
    :class:`HeldoutSplit`, handed to the workers as it is, or None). Few transforms: each is a fixed
    cost of every run."""
    fallback_ids, unk_id = special
    spills = (
        create_spread(pipeline, "DocumentShards", list(enumerate(paths)))
        | "EncodeShards" >> beam.ParDo(EncodeShardFn(tokenizer_dir, eos_id, spill, fallback_ids, unk_id,
                                                     settings.get("heldout"), token_dtype(settings["vocab_size"]).name))
    )
    written = (
        spills
        | "Summaries" >> beam.combiners.ToList()  # one small record per input shard
        | "PlanWrites" >> beam.FlatMap(plan_parts, settings=settings)
        | "SpreadWrites" >> beam.Reshuffle()
        | "WriteShards" >> beam.Map(write_part_shard, out=out, settings=settings)
    )
    _ = (
        pipeline
        | "Once" >> beam.Impulse()
        | "Finish" >> beam.Map(_finish, beam.pvalue.AsList(spills), beam.pvalue.AsList(written), out=out,
                               settings=settings, spill=spill)
    )


def run(ctx: StepContext) -> dict:
    """Encode, pack and write the shards of the config's ``input`` (see the module docstring).

    Raises:
        KeyError: missing input step; ValueError: an unsorted document shard; TokenizerFileError:
            tokenizer file hash mismatch.
    """
    cfg: TokenizeConfig = ctx.config  # parsed once, at plan time (or by the job command)
    seq_len, shards = cfg.seq_len, cfg.shards
    tokenizer_dir = ctx.input_uri(cfg.tokenizer)  # a location every worker can read: no local copy
    tokenizer, tok_meta = tokenizer_step.load(ctx.input_files(cfg.tokenizer))
    fallback_ids, unk_id = special_token_ids(tokenizer)
    documents = ctx.input_files(cfg.input)
    paths = [documents.uri_of(name) for name in shard_names(documents, DOCUMENTS_PREFIX, "parquet")]
    settings = {"seq_len": seq_len, "shards": shards, "vocab_size": tok_meta["vocab_size"],
                "tokenizer_hash": tok_meta["tokenizer_hash"],
                "heldout": cfg.heldout}
    out, spill = ctx.output(), ctx.spill()  # workers write there directly (a directory or the bucket)
    try:
        with beam.Pipeline(options=beam_options()) as pipeline:
            build_pipeline(pipeline, paths, str(tokenizer_dir), tok_meta["eos_id"], (fallback_ids, unk_id),
                           settings, out, spill)
    finally:
        spill.remove()
    meta = StepFiles.open(out.location).read_json(META_NAME)
    if cfg.heldout is not None and not meta["heldout_sequences"]:
        raise ValueError(f"source {cfg.source}: evaluation.heldout.fraction {cfg.heldout.fraction} holds out "
                         f"{meta['heldout_documents']} documents, fewer tokens than one sequence of {seq_len}; "
                         "raise the fraction")
    if meta["documents_failed"]:
        ctx.log.warning(
            "%s: %d documents failed to encode, see %s",
            ctx.name,
            meta["documents_failed"],
            FAILED_FILE,
        )
    return summarize(cfg, out.location)


def summarize(cfg: TokenizeConfig, out_dir: str | Path) -> dict:
    """The summary :func:`run` returns, from a finished job's ``meta.json``.

    Also what commits a job that ran elsewhere (:mod:`tidal.core.beam_job`).
    """
    meta = StepFiles.open(out_dir).read_json(META_NAME)
    return {
        "source": cfg.source,
        **{k: v for k, v in meta.items() if k != "tokenizer_hash"},
    }


def expected_outputs(cfg: TokenizeConfig) -> list[str]:
    """The files a finished tokenize run writes (docs/contracts.md): ``meta.json``,
    ``failed_documents.json`` and ``shards`` token shards (part of the kind's commit contract,
    :func:`tidal.core.commit.check_outputs`)."""
    shards = cfg.shards
    heldout = [HELDOUT_META, HELDOUT_DOCUMENTS, HELDOUT_TOKENS] if cfg.heldout is not None else []
    return [META_NAME, FAILED_FILE, *(shard_name(TOKENS_PREFIX, k, shards, "npy") for k in range(shards)), *heldout]


def check_outputs(cfg: TokenizeConfig, out_dir: str | Path) -> None:
    """Before a commit: the token shards hold ``meta.json``'s ``n_sequences`` rows of ``seq_len``
    tokens of its ``dtype`` (read from the ``.npy`` headers only), ``failed_documents.json``
    lists ``documents_failed`` documents, and a held-out shard holds its meta's ``n_sequences``.

    Raises:
        ValueError: naming the file and both values on a mismatch.
    """
    files = StepFiles.open(out_dir)
    out = files.uri
    meta = files.read_json(META_NAME)
    shards = cfg.shards
    if meta["seq_len"] != cfg.seq_len:
        raise ValueError(f"{out}/{META_NAME}: seq_len {meta['seq_len']} but the step's config says {cfg.seq_len}")
    rows = 0
    for k in range(shards):
        name = shard_name(TOKENS_PREFIX, k, shards, "npy")
        path = files.uri_of(name)
        shard = files.array(name)  # the header only; no data is read
        shape, dtype = shard.shape, shard.dtype
        del shard
        if len(shape) != 2 or shape[1] != meta["seq_len"] or dtype.name != meta["dtype"]:
            raise ValueError(f"{path}: shape {shape} of {dtype.name} but {META_NAME} says "
                             f"[*, {meta['seq_len']}] of {meta['dtype']}")
        rows += shape[0]
    if rows != meta["n_sequences"]:
        raise ValueError(f"{out}: token shards hold {rows} sequences but {META_NAME} says {meta['n_sequences']}")
    if cfg.heldout is not None:
        held, held_meta = files.array(HELDOUT_TOKENS), files.read_json(HELDOUT_META)
        if held.shape[0] != held_meta["n_sequences"] or held_meta["n_sequences"] != meta["heldout_sequences"]:
            raise ValueError(f"{out}/{HELDOUT_TOKENS}: {held.shape[0]} sequences but {HELDOUT_META} says "
                             f"{held_meta['n_sequences']} and {META_NAME} {meta['heldout_sequences']}")
        del held
    failed = len(files.read_json(FAILED_FILE))
    files.close()
    if failed != meta["documents_failed"]:
        raise ValueError(f"{out}/{FAILED_FILE} lists {failed} documents but {META_NAME} says "
                         f"{meta['documents_failed']}")


if __name__ == "__main__":
    tidal.data.jobcli.main(sys.modules[__name__], "tokenize")
