"""Tokenizer step: determinism across fresh processes, round trips, pinned files, special tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.data.builders import CORPUS_WORDS, write_clean_step
from tidal.context import StepContext
from tidal.data import tokenizer as tokenizer_step
from tidal.integrity.hashing import sha256_file

ROOT = Path(__file__).resolve().parents[2]
EOS = "<|endoftext|>"
MIXED = [
    "The quick brown fox jumps over the lazy dog.\n  Indented line\twith tab.",
    "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
    "Mixed 中文 and English: 数据 pipeline, ümlauts, emoji 🙂, and  double  spaces.",
    "Numbers 3.14159 and symbols <> {} [] ~ @ # $ % ^ & * ( ) — “quotes”.",
]


def corpus(n: int = 300) -> list[str]:
    """Deterministic synthetic English/Chinese documents."""
    words = CORPUS_WORDS
    return [
        " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(5 + i % 40)) + f" {i}"
        for i in range(n)
    ] + MIXED


def train_config(**overrides) -> dict:
    config = {
        "mode": "train",
        "vocab_size": 400,
        "min_frequency": 2,
        "special_tokens": [EOS],
        "sources": ["clean-a", "clean-b"],
        "max_documents_per_source": None,
    }
    return {**config, **overrides}


@pytest.fixture()
def cleaned(tmp_path: Path) -> dict[str, Path]:
    texts = corpus()
    return {
        "clean-a": write_clean_step(tmp_path / "clean-a", texts[::2], "a"),
        "clean-b": write_clean_step(tmp_path / "clean-b", texts[1::2], "b", shards=1),
    }


def run_step(config: dict, inputs: dict[str, Path], out: Path) -> dict:
    out.mkdir(parents=True)
    ctx = StepContext(
        step_id="tokenizer-test",
        name="tokenizer",
        kind="tokenizer",
        config=config,
        out_dir=out,
        inputs=inputs,
    )
    return tokenizer_step.run(ctx)


def test_training_is_byte_identical_in_two_fresh_processes(cleaned, tmp_path):
    hashes = []
    for attempt in range(2):
        out = tmp_path / f"out{attempt}"
        command = [
            sys.executable,
            "-m",
            "tidal.data.tokenizer",
            "--config",
            json.dumps(train_config()),
            "--out",
            str(out),
            *[f"--input={n}={d}" for n, d in cleaned.items()],
        ]
        # no outside knobs: the step itself must make training deterministic
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")
        }
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=60)
        meta = json.loads((out / "tokenizer_meta.json").read_text())
        assert meta["tokenizer_hash"] == sha256_file(out / "tokenizer.json")
        assert meta["eos_id"] == 0 and meta["special_tokens"] == [EOS]
        assert 256 < meta["vocab_size"] <= 400
        hashes.append(meta["tokenizer_hash"])
    assert hashes[0] == hashes[1]
    # and the in-process run agrees with the subprocesses
    assert run_step(train_config(), cleaned, tmp_path / "inproc")["tokenizer_hash"] == hashes[0]


def test_document_cap_changes_the_tokenizer(cleaned, tmp_path):
    full = run_step(train_config(), cleaned, tmp_path / "full")
    capped = run_step(train_config(max_documents_per_source=5), cleaned, tmp_path / "capped")
    assert full["tokenizer_hash"] != capped["tokenizer_hash"]


@pytest.mark.parametrize(
    "text", MIXED + ["", " leading space", "trailing space ", "\n\n", "a\u0301 NFD"]
)
def test_round_trip_mixed_english_chinese(cleaned, tmp_path, text):
    run_step(train_config(), cleaned, tmp_path / "tok")
    tokenizer, _ = tokenizer_step.load(tmp_path / "tok")
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text


def test_special_token_text_is_encoded_as_ordinary_text(cleaned, tmp_path):
    run_step(train_config(), cleaned, tmp_path / "tok")
    tokenizer, meta = tokenizer_step.load(tmp_path / "tok")
    text = f"before {EOS} after{EOS}"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert meta["eos_id"] not in ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(EOS, add_special_tokens=False).ids != [meta["eos_id"]]


def test_file_mode_checks_sha256(cleaned, tmp_path):
    run_step(train_config(), cleaned, tmp_path / "trained")
    path = tmp_path / "trained" / "tokenizer.json"
    digest = sha256_file(path)
    loaded = run_step(
        {"mode": "file", "path": str(path), "sha256": digest}, {}, tmp_path / "loaded"
    )
    assert loaded["tokenizer_hash"] == digest
    assert (tmp_path / "loaded" / "tokenizer.json").read_bytes() == path.read_bytes()
    with pytest.raises(
        tokenizer_step.TokenizerFileError, match=r"tokenizer\.json has sha256 .* pins 0{64}"
    ):
        run_step({"mode": "file", "path": str(path), "sha256": "0" * 64}, {}, tmp_path / "bad")
    with pytest.raises(tokenizer_step.TokenizerFileError, match="does not exist"):
        run_step(
            {"mode": "file", "path": str(tmp_path / "nope.json"), "sha256": digest},
            {},
            tmp_path / "missing",
        )


def test_bad_config_is_refused_before_anything_is_read(tmp_path):
    bad = [({"mode": "file", "path": "/x.json"}, "mode 'file' needs both `path` and `sha256`"),
           ({"mode": "gpt2", "encoder_path": "/e.json"}, "mode 'gpt2' needs `encoder_path`"),
           ({"mode": "bpe"}, "mode\n  Input should be 'train', 'file' or 'gpt2'"),
           (train_config(special_tokens=[]), "special_tokens\n  List should have at least 1 item"),
           (train_config(vocab_sise=300), "vocab_sise\n  Extra inputs are not permitted")]
    for n, (config, rule) in enumerate(bad):
        with pytest.raises(ValidationError, match=rule):
            run_step(config, {}, tmp_path / str(n))


def test_file_mode_refuses_tokenizer_without_eos(tmp_path):
    tokenizer = tokenizer_step.train_tokenizer(corpus(50), vocab_size=300, special_tokens=["<pad>"])
    path = tmp_path / "noeos.json"
    path.write_text(tokenizer.to_str())
    with pytest.raises(tokenizer_step.TokenizerFileError, match="no special tokens"):
        run_step(
            {"mode": "file", "path": str(path), "sha256": sha256_file(path)}, {}, tmp_path / "out"
        )


def test_gpt2_files_build_a_byte_level_bpe(tmp_path):
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    encoder = {symbol: index for index, symbol in enumerate(alphabet)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]
    for a, b in merges:
        encoder[a + b] = len(encoder)
    encoder[EOS] = len(encoder)
    (tmp_path / "encoder.json").write_text(json.dumps(encoder))
    (tmp_path / "vocab.bpe").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    )
    config = {
        "mode": "gpt2",
        "encoder_path": str(tmp_path / "encoder.json"),
        "encoder_sha256": sha256_file(tmp_path / "encoder.json"),
        "merges_path": str(tmp_path / "vocab.bpe"),
        "merges_sha256": sha256_file(tmp_path / "vocab.bpe"),
    }
    meta = run_step(config, {}, tmp_path / "out")
    assert meta["eos_id"] == encoder[EOS] and meta["vocab_size"] == len(encoder)
    tokenizer, _ = tokenizer_step.load(tmp_path / "out")
    assert tokenizer.encode("hello world", add_special_tokens=False).ids[:2] == [
        encoder["hell"],
        encoder["o"],
    ]
    assert tokenizer.decode(tokenizer.encode("hello world").ids) == "hello world"


def test_bad_merges_line_is_named():
    with pytest.raises(ValueError, match="line 3"):
        tokenizer_step.parse_gpt2_merges("#version: 0.2\na b\nabc\n")
