"""The tokenizer step's config (:class:`TokenizerConfig`) and the recipe's ``tokenizer`` section
(:class:`TokenizerSettings`), the part of it a recipe sets.

Light on purpose (no ``tokenizers``): the recipe imports it. The planner hashes the section's
``model_dump`` (in ``train`` mode without ``path`` and ``sha256``; in ``file`` mode only those and
``mode``) plus ``special_tokens`` and ``sources``; the step reads that dict back.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from tidal.config import PositiveInt, Sha256, Strict
from tidal.data.heldout import HeldoutSplit

DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>",)
BYTE_SYMBOLS = 256  # byte-level BPE: every byte is a symbol of the initial alphabet, so any text encodes
MIN_VOCAB_SIZE = BYTE_SYMBOLS + len(DEFAULT_SPECIAL_TOKENS)  # 257: the bytes and the end-of-text token
# 2**20: four times the largest vocabularies in use (~256 k tokens); the BPE trainer's memory and the model's
# embedding and output layers grow with it, and the tokenizers library aborts the process (a Rust panic,
# SIGABRT) on absurd sizes such as 10**12, with no error to report
MAX_VOCAB_SIZE = 1 << 20


class TokenizerSettings(Strict):
    """Train a byte-level BPE on the cleaned training text, or load a tokenizer.json file."""

    mode: Literal["train", "file"] = Field(default="train", description="train a BPE, or load a pinned file")
    vocab_size: PositiveInt = Field(
        default=4096, ge=MIN_VOCAB_SIZE, le=MAX_VOCAB_SIZE,
        description=f"target vocabulary size (tokens): at least {MIN_VOCAB_SIZE} (the {BYTE_SYMBOLS} byte symbols "
        f"of byte-level BPE and the end-of-text token), at most {MAX_VOCAB_SIZE:,} (2^20: four times the largest "
        "vocabularies in use; the BPE trainer's memory and the embedding grow with it, and the tokenizers library "
        "aborts the process on absurd sizes)")
    min_frequency: PositiveInt = Field(default=2, description="BPE merge minimum pair count")
    max_documents_per_source: PositiveInt | None = Field(
        default=None, description="cap documents per source used for training the tokenizer"
    )
    path: str | None = Field(default=None, description="tokenizer.json to load (mode: file)")
    sha256: Sha256 | None = Field(default=None, description="sha256 of that file (mode: file)")

    @model_validator(mode="after")
    def _file_mode(self) -> TokenizerSettings:
        if self.mode == "file" and (self.path is None or self.sha256 is None):
            raise ValueError("mode 'file' needs both `path` and `sha256`")
        return self


class TokenizerConfig(TokenizerSettings):
    """One tokenizer step: the recipe's settings, the special tokens and the clean steps to train
    on; by hand also ``mode: gpt2``, a GPT-2 ``encoder.json`` + ``vocab.bpe`` pair (DATA.md)."""

    mode: Literal["train", "file", "gpt2"] = Field(
        default="train", description="train a BPE, load a pinned tokenizer.json, or build GPT-2's from its files"
    )
    special_tokens: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: list(DEFAULT_SPECIAL_TOKENS), min_length=1,
        description="special tokens; the first is end-of-text"
    )
    sources: list[str] = Field(
        default_factory=list, description="clean steps to train on, in this order (mode: train); empty: every "
        "input, sorted"
    )
    heldout: HeldoutSplit | None = Field(
        default=None, description="documents held out of training (mode: train; tidal/data/heldout.py)")
    encoder_path: str | None = Field(default=None, description="GPT-2 encoder.json (mode: gpt2)")
    encoder_sha256: Sha256 | None = Field(default=None, description="sha256 of encoder.json (mode: gpt2)")
    merges_path: str | None = Field(default=None, description="GPT-2 vocab.bpe (mode: gpt2)")
    merges_sha256: Sha256 | None = Field(default=None, description="sha256 of vocab.bpe (mode: gpt2)")

    @model_validator(mode="after")
    def _room_for_specials(self) -> TokenizerConfig:
        floor = BYTE_SYMBOLS + len(self.special_tokens)
        if self.mode == "train" and self.vocab_size < floor:
            raise ValueError(f"vocab_size {self.vocab_size} cannot hold the {BYTE_SYMBOLS} byte symbols and "
                             f"{len(self.special_tokens)} special tokens (at least {floor})")
        return self

    @model_validator(mode="after")
    def _gpt2_files(self) -> TokenizerConfig:
        files = (self.encoder_path, self.encoder_sha256, self.merges_path, self.merges_sha256)
        if self.mode == "gpt2" and any(value is None for value in files):
            raise ValueError("mode 'gpt2' needs `encoder_path`, `encoder_sha256`, `merges_path` and `merges_sha256`")
        return self
