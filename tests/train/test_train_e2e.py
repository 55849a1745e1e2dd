"""End-to-end tests of the train step through the real subprocess entrypoint.

Covers: loss falls on a learnable synthetic dataset (via ``tidal.train.run``); stop at a
checkpoint and resume in a fresh process is bitwise identical to an uninterrupted run;
a corrupted checkpoint is skipped in favour of the previous one; a tokenizer hash mismatch
is refused with a message naming both hashes and the directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tidal.train
from tidal.context import StepContext
from tidal.launch.local import TrainingFailed, run_entrypoint

VOCAB, SEQ_LEN = 64, 33
STEPS = 24


def tokenizer_json() -> str:
    """A byte-level vocabulary of 64 ids: the end-of-text special, then ASCII strings of 1-3 bytes."""
    from tokenizers import Tokenizer, decoders, models

    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!"
    vocab = {"<|endoftext|>": 0} | {letters[i - 1] * (1 + i % 3): i for i in range(1, VOCAB)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens(["<|endoftext|>"])
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


TOKENIZER_JSON = tokenizer_json()
TOK_HASH = hashlib.sha256(TOKENIZER_JSON.encode()).hexdigest()


def write_tokens(directory: Path, n_seq: int, seed: int, meta_name: str, tokenizer_hash: str = TOK_HASH,
                 shards: int = 2) -> None:
    """Sequences that follow one fixed cycle through the vocabulary (a learnable bigram)."""
    directory.mkdir(parents=True)
    cycle = np.random.default_rng(0).permutation(VOCAB)
    succ = np.empty(VOCAB, dtype=np.int64)
    succ[cycle] = np.roll(cycle, -1)
    rows = np.empty((n_seq, SEQ_LEN), dtype=np.uint16)
    rows[:, 0] = np.random.default_rng(seed).integers(0, VOCAB, n_seq)
    for t in range(1, SEQ_LEN):
        rows[:, t] = succ[rows[:, t - 1]]
    for i, part in enumerate(np.array_split(rows, shards)):
        np.save(directory / f"tokens-{i:05d}-of-{shards:05d}.npy", part)
    (directory / meta_name).write_text(json.dumps({"tokenizer_hash": tokenizer_hash, "seq_len": SEQ_LEN}))


@pytest.fixture(scope="module", autouse=True)
def fast_subprocesses(tmp_path_factory):
    """Share compiled bytecode between the entrypoint subprocesses (XLA executables are shared by the
    run's cache, tests/conftest.py). Speed only."""
    cache = tmp_path_factory.mktemp("caches")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        mp.setenv("PYTHONPYCACHEPREFIX", str(cache / "pycache"))
        yield


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    return build_inputs(tmp_path_factory.mktemp("inputs"))


def committed_inputs(root: Path) -> tuple[Any, tuple[Any, ...]]:
    """A storage root ``root/root`` holding :func:`build_inputs`' tokenizer, mix and tokenize-udhr as
    committed (sealed) steps: ``(storage, the three steps)``, what a train step's runner reads."""
    from tests.conftest import seal
    from tidal.steps import Step
    from tidal.storage import open_storage

    (root / "root").mkdir()
    storage = open_storage(str(root / "root"))
    build_inputs(root / "inputs")
    inputs = tuple(Step(name, "fetch", {"made": name}) for name in ("tokenizer", "mix", "tokenize-udhr"))
    for step in inputs:
        (root / "inputs" / step.name).rename(storage.step_dir(step.step_id))
        seal(storage.step_dir(step.step_id))
    return storage, inputs


def build_inputs(root: Path) -> dict[str, Path]:
    """Tokenizer, a 96-sequence mixture and a 16-sequence eval source under ``root``
    (shared with the preemption, distributed and metrics tests)."""
    (root / "tokenizer").mkdir(parents=True)
    (root / "tokenizer" / "tokenizer_meta.json").write_text(
        json.dumps({"tokenizer_hash": TOK_HASH, "vocab_size": VOCAB, "eos_id": 0}))
    (root / "tokenizer" / "tokenizer.json").write_text(TOKENIZER_JSON)
    write_tokens(root / "mix", 96, seed=1, meta_name="mixture.json", shards=3)
    write_tokens(root / "tokenize-udhr", 16, seed=2, meta_name="meta.json", shards=1)
    return {"tokenizer": root / "tokenizer", "mix": root / "mix", "tokenize-udhr": root / "tokenize-udhr"}


CONFIG = {
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64},
    "optimizer": {"lr": 1e-2, "min_lr_ratio": 0.1, "warmup_steps": 3, "weight_decay": 0.01,
                  "b1": 0.9, "b2": 0.95, "grad_clip": 1.0},
    "steps": STEPS, "batch_size": 8, "checkpoint_every": 5, "eval_every": 10, "eval_batches": 2,
    "log_every": 1, "keep_checkpoints": 2,
    "train_data": "mix", "eval_data": {"udhr": "tokenize-udhr"}, "tokenizer": "tokenizer",
}


def make_ctx(out_dir: Path, inputs: dict[str, Path], config: dict = CONFIG) -> StepContext:
    return StepContext(step_id="train-0123456789ab", name="train", kind="train", config=config,
                       out_dir=out_dir, inputs=inputs, input_ids={n: f"{n}-x" for n in inputs},
                       seed=2**62 + 12345, log=logging.getLogger("test.train"))


def losses(step_dir: Path) -> list[tuple[int, float]]:
    lines = (step_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines) if "loss" in r]  # step 0: evals only


def final_params(step_dir: Path) -> dict[str, np.ndarray]:
    """Leaves of the final checkpoint, read with numpy from orbax (no template)."""
    import jax
    import orbax.checkpoint as ocp

    from tidal.train.packing import PACKED_KEY, split_packed

    step = json.loads((step_dir / "summary.json").read_text())["checkpoint_step"]
    with ocp.CheckpointManager(step_dir / "checkpoints") as manager:
        tree = manager.restore(step, args=ocp.args.StandardRestore())
        leaves = (manager.item_metadata(step).custom_metadata or {}).get(PACKED_KEY)
    if leaves is not None:  # a packed (CPU-run) checkpoint: one array per dtype
        return {key: np.asarray(v) for key, v in split_packed(tree["packed"], leaves).items()}
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs) -> tuple[Path, dict]:
    """One uninterrupted run through the step kind's ``run``."""
    out = tmp_path_factory.mktemp("reference")
    summary = tidal.train.run(make_ctx(out, inputs))
    return out, summary


def test_loss_falls_and_summary(reference):
    out, summary = reference
    seen = losses(out)
    assert [s for s, _ in seen] == list(range(1, STEPS + 1))
    first, last = seen[0][1], seen[-1][1]
    assert first > 3.5 and last < 0.5 * first, seen
    assert summary["steps"] == STEPS and summary["tokens_seen"] == STEPS * 8 * (SEQ_LEN - 1)
    assert summary["final_train_loss"] == last
    assert summary["eval_loss"] == summary["eval_loss/udhr"] < 0.6 * first
    assert summary["checkpoint_step"] == STEPS
    manifest = json.loads((out / "checkpoint_manifest.json").read_text())
    assert manifest["step"] == STEPS and manifest["root_hash"] == summary["checkpoint_root_hash"]
    # keep_checkpoints=2: only the newest two remain, with their manifests
    assert sorted(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit()) == [20, 24]
    assert sorted(p.name for p in (out / "checkpoint_manifests").iterdir()) == ["20.json", "24.json"]
    spec = json.loads((out / "spec.json").read_text())
    assert set(spec["inputs"]) == {"tokenizer", "mix", "tokenize-udhr"}
    assert spec["seed"] == 2**62 + 12345 and spec["config"] == CONFIG


def test_resume_in_fresh_process_is_bitwise_identical(tmp_path, inputs, reference):
    ref_dir, ref_summary = reference
    ctx = make_ctx(tmp_path / "train", inputs)
    tidal.train.write_spec(ctx)
    run_entrypoint(ctx.out_dir, extra_args=["--stop-after", "13"])  # dies mid-way; last checkpoint: 10
    assert not (ctx.out_dir / "summary.json").exists()
    assert losses(ctx.out_dir)[-1][0] == 13
    summary = tidal.train.run(ctx)  # fresh process resumes from step 10, redoes 11..13
    assert losses(ctx.out_dir) == losses(ref_dir)  # no duplicate lines, bitwise equal losses
    got, want = final_params(ctx.out_dir), final_params(ref_dir)
    assert got.keys() == want.keys()
    for key in want:
        assert np.array_equal(got[key], want[key]), key
    assert summary["final_train_loss"] == ref_summary["final_train_loss"]
    assert summary["eval_loss/udhr"] == ref_summary["eval_loss/udhr"]


def test_corrupted_checkpoint_is_skipped(tmp_path, inputs, reference, caplog):
    ref_dir, _ = reference
    ctx = make_ctx(tmp_path / "train", inputs)
    tidal.train.write_spec(ctx)
    run_entrypoint(ctx.out_dir, extra_args=["--stop-after", "15"])  # checkpoints 10 and 15
    ckpt15 = ctx.out_dir / "checkpoints" / "15"
    victim = max((p for p in ckpt15.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="test.train"):
        tidal.train.run(ctx)
    text = caplog.text
    assert "failed verification" in text and "sha256 differs" in text, text
    assert "resumed from checkpoint step 10" in text
    assert losses(ctx.out_dir) == losses(ref_dir)
    got, want = final_params(ctx.out_dir), final_params(ref_dir)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_tokenizer_hash_mismatch_is_refused(tmp_path, inputs):
    bad = tmp_path / "mix-other"
    write_tokens(bad, 8, seed=3, meta_name="mixture.json", tokenizer_hash="b" * 64)
    ctx = make_ctx(tmp_path / "train", {**inputs, "mix": bad})
    with pytest.raises(TrainingFailed) as info:
        tidal.train.run(ctx)
    err = info.value
    assert err.exit_code == 2
    message = "\n".join(err.tail)
    assert "tokenizer hash mismatch" in message
    assert "b" * 64 in message and TOK_HASH in message and str(bad / "mixture.json") in message


def test_bits_per_byte_and_run_metrics(reference, inputs):
    out, summary = reference
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(TOKENIZER_JSON)
    byte_len = {i: len(tok.decode([i]).encode("utf-8")) for i in range(VOCAB)}  # eos decodes to ""
    shards = sorted((inputs["tokenize-udhr"]).glob("tokens-*.npy"))
    rows = np.concatenate([np.load(p) for p in shards])[: 2 * 8]  # eval_batches * batch_size
    targets = rows[:, 1:]
    n_bytes = sum(byte_len[int(t)] for t in targets.ravel())
    want = summary["eval_loss/udhr"] * targets.size / math.log(2) / n_bytes
    assert summary["eval_bpb/udhr"] == pytest.approx(want, rel=1e-9)
    assert summary["eval_bpb"] == summary["eval_bpb/udhr"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for r in records[1:]:  # step 0 (before any update) holds the evals only
        assert r["tokens_per_second"] > 0 and r["step_time_s"] > 0
        assert r["peak_memory_bytes"] >= r["memory_bytes"] > 0
    evals = [r for r in records if "eval_bpb/udhr" in r]
    assert [r["step"] for r in evals] == [0, 10, 20, 24]
    assert summary["peak_memory_bytes"] > 0 and summary["mesh"] == "data=1 fsdp=1 tensor=1"
    assert json.loads(summary["environment_fingerprint"])["packages"]["jax"]


def test_resume_under_another_fingerprint_warns_in_log_and_mlflow(tmp_path, inputs, reference):
    from mlflow.tracking import MlflowClient

    ref_dir, _ = reference
    ctx = make_ctx(tmp_path / "train", inputs)
    tidal.train.write_spec(ctx)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri, "TIDAL_MLFLOW_EXPERIMENT": "live-test"}
    run_entrypoint(ctx.out_dir, extra_args=["--stop-after", "13"], env=env)
    manifest_path = ctx.out_dir / "checkpoint_manifests" / "10.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["fingerprint"]["packages"]["jax"]
    manifest["fingerprint"]["python"] = "2.7.18"  # as if saved by another interpreter
    manifest_path.write_text(json.dumps(manifest))
    lines = []
    run_entrypoint(ctx.out_dir, env=env, log=_ListLogger(lines))
    text = "\n".join(lines)
    assert "resumed from checkpoint step 10" in text
    assert "different environment fingerprint" in text and "python: 2.7.18 ->" in text, text
    summary = json.loads((ctx.out_dir / "summary.json").read_text())
    assert summary["fingerprint_changed"].startswith("python: 2.7.18 ->")
    assert losses(ctx.out_dir) == losses(ref_dir)  # a warning, not a change of computation
    run_id = json.loads((ctx.out_dir / "mlflow_run.json").read_text())["run_id"]
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.tags["tidal.fingerprint_changed"].startswith("python: 2.7.18 ->")
    assert run.data.tags["tidal.checkpoint_root_hash"] == summary["checkpoint_root_hash"]
    assert run.info.status == "FINISHED"
    history = MlflowClient(uri).get_metric_history(run_id, "loss")
    assert sorted({m.step for m in history}) == list(range(1, STEPS + 1))  # both processes, one run


class _ListLogger(logging.Logger):
    """A logger that keeps every line (run_entrypoint streams the child's output to it)."""

    def __init__(self, lines: list[str]):
        super().__init__("test.train.lines", logging.INFO)
        self.lines = lines

    def info(self, msg, *args, **kwargs):
        self.lines.append(msg % args if args else msg)


def test_heldout_split_and_step_zero_evals(tmp_path, inputs):
    """A tokenize step's held-out split is evaluated as heldout/<source>; every eval set is evaluated
    at step 0, before any update, and the summary keeps that first value beside the last."""
    from tidal.core.report import eval_curves

    split = tmp_path / "tokenize-syn"
    write_tokens(split, 40, seed=4, meta_name="meta.json", shards=1)  # the training part (unused here)
    write_tokens(tmp_path / "held", 16, seed=5, meta_name="meta.json", shards=1)
    (tmp_path / "held" / "tokens-00000-of-00001.npy").rename(split / "heldout-tokens-00000-of-00001.npy")
    (tmp_path / "held" / "meta.json").rename(split / "heldout-meta.json")
    config = {**CONFIG, "steps": 12, "checkpoint_every": 6, "eval_every": 6, "heldout_data": {"syn": "tokenize-syn"}}
    out = tmp_path / "train"
    summary = tidal.train.run(make_ctx(out, {**inputs, "tokenize-syn": split}, config))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 0 and "loss" not in records[0]
    assert set(records[0]) == {"step", "eval_loss/udhr", "eval_bpb/udhr", "eval_loss/heldout/syn",
                               "eval_bpb/heldout/syn"}
    assert [r["step"] for r in records if "eval_loss/heldout/syn" in r] == [0, 6, 12]
    first, last = records[0]["eval_loss/heldout/syn"], summary["eval_loss/heldout/syn"]
    assert summary["initial_eval_loss/heldout/syn"] == first > math.log(VOCAB) - 1  # untrained: about ln V
    assert last < 0.6 * first  # the held-out split is the same bigram: its loss falls
    assert summary["initial_eval_loss/udhr"] == records[0]["eval_loss/udhr"]
    assert eval_curves(summary) == {"heldout/syn": [first, last],
                                    "udhr": [records[0]["eval_loss/udhr"], summary["eval_loss/udhr"]]}


def test_a_failed_save_stops_training_at_once_with_one_error_line(tmp_path, inputs):
    """A checkpoint that cannot be written (its directory immutable: not even root may add to it) stops the
    run at that save; the process exits 1 within seconds (not after orbax's 300 s wait for the failed save's
    signals) with one ``error:`` line naming the checkpoint and the cause, and no traceback on stderr."""
    import subprocess
    import sys
    import time

    ctx = make_ctx(tmp_path / "train", inputs)
    tidal.train.write_spec(ctx)
    checkpoints = ctx.out_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    locked = subprocess.run(["chattr", "+i", str(checkpoints)], capture_output=True, text=True, check=False)
    if locked.returncode != 0:
        pytest.skip(f"this filesystem has no immutable flag (chattr: {locked.stderr.strip()})")
    try:
        tick = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "tidal.train", str(ctx.out_dir)], capture_output=True,
                              text=True, timeout=280, check=False)
        took = time.monotonic() - tick
    finally:
        subprocess.run(["chattr", "-i", str(checkpoints)], check=True)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("tidal.train: error: checkpoint of step 5 "), proc.stderr[-3000:]
    assert "was not saved: PermissionError" in errors[0] and "Traceback" not in proc.stderr
    assert took < 120, f"exited after {took:.0f} s"
    assert not (ctx.out_dir / "summary.json").exists()


def test_a_disk_smaller_than_one_checkpoint_stops_with_one_error_line(tmp_path, inputs):
    """Issue 43, item 8: the checkpoint directory on a disk smaller than one checkpoint (a 256 KiB tmpfs):
    the run stops at the first save with one ``error:`` line naming the checkpoint and the full disk, none of
    orbax's tracebacks (it logged the same error 5 times, about 450 lines), and a short log."""
    import subprocess
    import sys

    ctx = make_ctx(tmp_path / "train", inputs)
    tidal.train.write_spec(ctx)
    checkpoints = ctx.out_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tidal-small", str(checkpoints)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (mount: {mounted.stderr.strip()})")
    try:
        proc = subprocess.run([sys.executable, "-m", "tidal.train", str(ctx.out_dir)], capture_output=True,
                              text=True, timeout=280, check=False)
    finally:
        subprocess.run(["umount", "-l", str(checkpoints)], check=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("tidal.train: error: checkpoint of step 5 "), output[-3000:]
    assert "No space left on device" in errors[0], output[-3000:]
    # orbax's own records of the failed save are kept out (tidal/train/orbax_logs.py); on a loaded machine
    # TensorStore may still print one bare traceback of its write callback resuming orbax's closed event loop
    # (asyncio call_soon_threadsafe, from C++, not through Python's logging or excepthook): nothing else
    assert output.count("Traceback") == 0 or (output.count("Traceback") == 1 and "call_soon_threadsafe" in output
                                              and "orbax" not in output.split("Traceback", 1)[1].split("\n")[1]), \
        output[-3000:]
    assert len(output.splitlines()) < 60, output[-3000:]


def test_block_reads_train_and_resume_bitwise(tmp_path, inputs):
    """train.block_reads: the trainer reads the mixture in shuffled blocks (96 sequences, batch 8: blocks of
    12, one per lane, 12 steps an epoch), its loss falls, and a run stopped at step 13 (the second epoch)
    resumes bitwise."""
    from tidal.train.trainer import load_spec, train

    config = {**CONFIG, "block_reads": {"block_bytes": 4096, "window_blocks": 1}}
    whole, stopped = (make_ctx(tmp_path / name, inputs, config) for name in ("whole", "stopped"))
    for ctx in (whole, stopped):
        tidal.train.write_spec(ctx)
    summary = train(whole.out_dir, load_spec(whole.out_dir))  # in this process: no trainer start-up
    curve = losses(whole.out_dir)
    assert curve[-1][1] < curve[0][1]
    assert train(stopped.out_dir, load_spec(stopped.out_dir), stop_after=13) is None
    resumed = train(stopped.out_dir, load_spec(stopped.out_dir))
    assert losses(stopped.out_dir) == curve and resumed["final_train_loss"] == summary["final_train_loss"]


def test_load_time_mixture_trains_and_resumes_bitwise_across_a_stage_end(tmp_path, inputs):
    """mixture.load_time with two stages (the second starts at step 12: 96 sequences, blocks of 16): the mix
    step writes only its index, the trainer reads each batch row from its tokenize step, the loss falls, and a
    run stopped at step 10 resumes across the stage end bitwise."""
    from tidal.data import mix as mix_step
    from tidal.train.trainer import load_spec, train

    tokenized = {}
    for i, (src, n) in enumerate((("a", 40), ("b", 24))):
        directory = tmp_path / f"tokenize-{src}"
        write_tokens(directory, n, seed=10 + i, meta_name="meta.json")
        (directory / "meta.json").write_text(json.dumps({"tokenizer_hash": TOK_HASH, "seq_len": SEQ_LEN,
                                                         "dtype": "uint16", "n_sequences": n}))
        tokenized[f"tokenize-{src}"] = directory
    (tmp_path / "mix").mkdir()
    mix_config = {"weights": {"a": 0.5, "b": 0.5}, "inputs": {"a": "tokenize-a", "b": "tokenize-b"},
                  "n_sequences": None, "shards": 1, "load_time": True, "block_sequences": 16, "batch_size": 8,
                  "size": {"mode": "token_budget", "tokens": STEPS * 8 * SEQ_LEN, "max_epochs": 4.0},
                  "stages": [{"weights": {"a": 0.75, "b": 0.25}, "until_step": 12},
                             {"weights": {"a": 0.25, "b": 0.75}}]}
    mix_step.run(StepContext("mix-t", "mix", "mix", mix_config, tmp_path / "mix", tokenized, seed=5))
    assert [p.name for p in (tmp_path / "mix").iterdir()] == ["mixture.json"]
    stages = json.loads((tmp_path / "mix" / "mixture.json").read_text())["load_time"]["stages"]
    assert stages[1]["start_sequence"] == 96
    mixed = {**inputs, "mix": tmp_path / "mix", **tokenized}
    whole, stopped = (make_ctx(tmp_path / name, mixed) for name in ("whole", "stopped"))
    for ctx in (whole, stopped):
        tidal.train.write_spec(ctx)
    summary = train(whole.out_dir, load_spec(whole.out_dir))
    curve = losses(whole.out_dir)
    assert curve[-1][1] < curve[0][1]
    assert train(stopped.out_dir, load_spec(stopped.out_dir), stop_after=10) is None
    resumed = train(stopped.out_dir, load_spec(stopped.out_dir))
    assert losses(stopped.out_dir) == curve and resumed["final_train_loss"] == summary["final_train_loss"]
