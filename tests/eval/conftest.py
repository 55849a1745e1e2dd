"""A real committed train step with a byte-level BPE tokenizer (every text encodes), for the eval tests.

The tokenizer is trained by ``tokenizers`` on the contexts of the repository's last-word task; the
train step (8 updates on a learnable bigram over its first 64 ids) is run and committed by the real
runner, so the eval step reads it exactly as it reads the tiny recipe's train step.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import seal
from tidal.eval.build_tasks import TASKS_DIR

SEQ_LEN = 33
BIGRAM_VOCAB = 64


def byte_level_tokenizer_json() -> str:
    """A byte-level BPE of at most 320 ids trained on the last-word task's contexts; id 0 is end-of-text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [json.loads(line)["context"] for line in (TASKS_DIR / "tidal_brown_lastword.jsonl").open()]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok.to_str()


def _tokens(directory: Path, n_seq: int, seed: int, meta_name: str, tok_hash: str) -> None:
    directory.mkdir(parents=True)
    cycle = np.random.default_rng(0).permutation(BIGRAM_VOCAB)
    succ = np.empty(BIGRAM_VOCAB, dtype=np.int64)
    succ[cycle] = np.roll(cycle, -1)
    rows = np.empty((n_seq, SEQ_LEN), dtype=np.uint16)
    rows[:, 0] = np.random.default_rng(seed).integers(0, BIGRAM_VOCAB, n_seq)
    for t in range(1, SEQ_LEN):
        rows[:, t] = succ[rows[:, t - 1]]
    np.save(directory / "tokens-00000-of-00001.npy", rows)
    (directory / meta_name).write_text(json.dumps({"tokenizer_hash": tok_hash, "seq_len": SEQ_LEN}))


@pytest.fixture(scope="session")
def committed_train(tmp_path_factory):
    """``(storage, train step, tokenizer step)``: a committed 8-update train step (permanent checkpoints
    at 4 and 8) and its inputs."""
    from tidal.core.runner import run_step
    from tidal.steps import Step
    from tidal.storage import open_storage
    from tidal.train.config import TrainConfig

    root = tmp_path_factory.mktemp("eval-train")
    storage = open_storage(str(root / "root"))
    text = byte_level_tokenizer_json()
    tok_hash = hashlib.sha256(text.encode()).hexdigest()
    vocab = json.loads(text)["model"]["vocab"]
    made = {name: Step(name, "fetch", {"made": name, "tok": tok_hash})
            for name in ("tokenizer", "mix", "tokenize-udhr")}
    tok_dir = storage.step_dir(made["tokenizer"].step_id)
    tok_dir.mkdir(parents=True)
    (tok_dir / "tokenizer.json").write_text(text)
    (tok_dir / "tokenizer_meta.json").write_text(json.dumps({"tokenizer_hash": tok_hash, "vocab_size": len(vocab),
                                                             "eos_id": vocab["<|endoftext|>"]}))
    _tokens(storage.step_dir(made["mix"].step_id), 96, 1, "mixture.json", tok_hash)
    _tokens(storage.step_dir(made["tokenize-udhr"].step_id), 16, 2, "meta.json", tok_hash)
    for step in made.values():
        seal(storage.step_dir(step.step_id))
    fields = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64},
              "optimizer": {"lr": 1e-2, "warmup_steps": 2}, "steps": 8, "batch_size": 8, "checkpoint_every": 4,
              "checkpoint_permanent_every": 4,
              "eval_every": 4, "eval_batches": 1, "log_every": 1}
    config = {"seed": 5, **TrainConfig.model_validate(fields).model_dump(), "train_data": "mix",
              "eval_data": {"udhr": "tokenize-udhr"}, "tokenizer": "tokenizer"}
    train = Step("train", "train", config, inputs=tuple(made.values()))
    run_step(train, storage)
    assert storage.is_committed(train.step_id)
    return storage, train, made["tokenizer"]


@pytest.fixture(scope="session")
def trained(committed_train):
    """The committed train step's final checkpoint as a :class:`tidal.train.trained.TrainedModel`."""
    from tidal.train.trained import load_trained

    storage, train, _ = committed_train
    return load_trained(storage.step_dir(train.step_id))
