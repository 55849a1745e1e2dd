"""Step kinds read committed inputs in place from a bucket: the tokenizer, tokenize (a Beam job whose
workers read the shards by URI), mix, stats, gate and the scaling fit's run reader give the same
bytes from ``s3://`` inputs as from local directories, without downloading a step directory
(the contexts here cannot: they have no ``resolve``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.data.builders import write_clean_step
from tidal.context import StepContext
from tidal.data import mix as mix_step
from tidal.data import stats as stats_step
from tidal.data import tokenize as tokenize_step
from tidal.data import tokenizer as tokenizer_step
from tidal.files.step_files import StepFiles, bytes_fetched
from tidal.quality import gates
from tidal.scaling.fit_step import read_runs
from tidal.scaling.suite import FitRun, FitStepConfig
from tidal.train.loader import TokenShards, read_tokenizer_meta, token_byte_lengths


def texts(source: str, n: int) -> list[str]:
    words = {"en": ["data", "model", "the", "of", "token", "shard"], "zh": ["数据", "模型", "训练", "春", "风"]}[source]
    return [" ".join(words[(i + j) % len(words)] for j in range(3 + i % 25)) + f" {source}{i}" for i in range(n)]


CONFIGS = {
    "tokenizer": ("tokenizer", {"mode": "train", "vocab_size": 300, "min_frequency": 2,
                                "sources": ["clean-en", "clean-zh"]}),
    "tokenize-en": ("tokenize", {"source": "en", "input": "clean-en", "tokenizer": "tokenizer", "seq_len": 16,
                                 "shards": 2}),
    "tokenize-zh": ("tokenize", {"source": "zh", "input": "clean-zh", "tokenizer": "tokenizer", "seq_len": 16,
                                 "shards": 2}),
    "mix": ("mix", {"weights": {"en": 0.7, "zh": 0.3}, "inputs": {"en": "tokenize-en", "zh": "tokenize-zh"},
                    "shards": 2}),
    "stats": ("stats", {"clean": {"en": "clean-en", "zh": "clean-zh"},
                        "tokenize": {"en": "tokenize-en", "zh": "tokenize-zh"}, "mix": "mix"}),
}
MODULES = {"tokenizer": tokenizer_step, "tokenize": tokenize_step, "mix": mix_step, "stats": stats_step}


def run_step(name: str, root: Path, inputs: dict[str, Path | str]) -> Path:
    kind, config = CONFIGS[name]
    out = root / name
    out.mkdir(parents=True)
    MODULES[kind].run(StepContext(f"{name}-t", name, kind, config, out, dict(inputs), seed=3))
    return out


def files_of(step_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(step_dir).as_posix(): p.read_bytes() for p in sorted(step_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def local_chain(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("local")
    steps: dict[str, Path] = {
        "clean-en": write_clean_step(root / "clean-en", texts("en", 120), "en",
                                     {"in": 125, "kept": 120, "filtered": {"too_short": 3}, "duplicates": 0,
                                      "quarantined": {"invalid_utf8": 2}}),
        "clean-zh": write_clean_step(root / "clean-zh", texts("zh", 80), "zh",
                                     {"in": 80, "kept": 80, "filtered": {}, "duplicates": 0, "quarantined": {}}),
    }
    for name in CONFIGS:
        steps[name] = run_step(name, root, steps)
    return steps


def test_every_data_kind_gives_the_same_bytes_from_bucket_inputs(local_chain, upload, tmp_path):
    uris: dict[str, str] = {n: upload(local_chain[n], f"{n}-x") for n in ("clean-en", "clean-zh")}
    for name in CONFIGS:
        out = run_step(name, tmp_path / "bucket", uris)
        assert files_of(out) == files_of(local_chain[name]), name
        uris[name] = upload(out, f"{name}-x")
    ctx = StepContext("gate-t", "gate", "gate", {"stats": "stats", "min_total_tokens": 100, "weights": {
        "en": 0.7, "zh": 0.3}, "mixture_tolerance": 0.05, "max_quarantine_rate": 0.1, "max_duplicate_rate": 0.5},
        tmp_path / "gate", {"stats": uris["stats"]})
    ctx.out_dir.mkdir()
    assert gates.run(ctx)["gate_success"] == 1
    local = StepContext("gate-t", "gate", "gate", ctx.config, tmp_path / "gate-local", {"stats": local_chain["stats"]})
    local.out_dir.mkdir()
    gates.run(local)
    assert (ctx.out_dir / "gate_result.json").read_bytes() == (local.out_dir / "gate_result.json").read_bytes()


def test_stats_fetches_the_text_column_and_small_files_only(local_chain, upload, tmp_path):
    uris = {n: upload(local_chain[n], f"{n}-s") for n in ("clean-en", "clean-zh", "tokenize-en", "tokenize-zh",
                                                         "mix")}
    whole = sum(StepFiles.open(u).size(n) for u in uris.values() for n in StepFiles.open(u).names())
    before = bytes_fetched()
    out = run_step("stats", tmp_path, uris)
    fetched = bytes_fetched() - before
    assert files_of(out) == files_of(local_chain["stats"])
    needed = sum(StepFiles.open(u).size(n) for u in uris.values()
                 for n in StepFiles.open(u).names() if n.startswith("documents-") or n.endswith(".json"))
    # tiny shards: a parquet reader's footer read (64 KiB) is the whole file, read once; no token shard
    assert fetched <= needed < whole, (fetched, needed, whole)


def test_the_trainer_opens_bucket_inputs_in_place(local_chain, upload):
    mix, tok = upload(local_chain["mix"], "mix-t"), upload(local_chain["tokenizer"], "tokenizer-t")
    meta = read_tokenizer_meta(tok)
    assert meta == read_tokenizer_meta(local_chain["tokenizer"])
    remote = TokenShards(mix, tokenizer_hash=meta["tokenizer_hash"], tokenizer_dir=tok)
    local = TokenShards(local_chain["mix"], tokenizer_hash=meta["tokenizer_hash"])
    every = np.arange(local.n_sequences)
    np.testing.assert_array_equal(remote.rows(every, meta["vocab_size"]), local.rows(every, meta["vocab_size"]))
    np.testing.assert_array_equal(token_byte_lengths(tok, meta["vocab_size"], meta["tokenizer_hash"]),
                                  token_byte_lengths(local_chain["tokenizer"], meta["vocab_size"]))


def test_the_scaling_fit_reads_train_summaries_in_place(local_chain, upload, tmp_path):
    mix = upload(local_chain["mix"], "mix-f")
    records = [{"step": s, "loss": 5.0 - s / 10} for s in range(1, 21)]
    train = tmp_path / "train"
    train.mkdir()
    (train / "summary.json").write_text(json.dumps({"steps": 20, "tokens_seen": 20_000, "param_count": 1000,
                                                    "flops_per_token": 6000.0, "final_train_loss": 3.0}))
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (train / "spec.json").write_text(json.dumps({"inputs": {"mix": mix}}))
    config = FitStepConfig(loss="train_loss_tail", tail_fraction=0.5, seed=0, runs={"train": FitRun(
        budget=1e9, model={"d_model": 8, "n_layers": 1, "d_ff": 32}, planned_flops=1e9, planned_tokens=20_000)})
    from_bucket, _ = read_runs({"train": upload(train, "train-f")}, config)
    from_dir, _ = read_runs({"train": train}, config)
    assert {k: v.tolist() for k, v in from_bucket.items()} == {k: v.tolist() for k, v in from_dir.items()}
    n_sequences = json.loads((local_chain["mix"] / "mixture.json").read_text())["n_sequences"]
    assert from_bucket["epochs"][0] == pytest.approx(20_000 / (n_sequences * 15))  # mixture.json read by URI
    assert from_bucket["loss"][0] == pytest.approx(np.mean([r["loss"] for r in records[10:]]))
