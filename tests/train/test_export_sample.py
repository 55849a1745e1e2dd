"""``tidal export STEP --format hf`` and ``tidal sample STEP`` on a real committed train step (issue 23, items 4, 5).

The step: 8 updates of a grouped-query model (4 query heads, 2 key/value heads) on the learnable
bigram data of test_train_e2e, run and committed by the real runner. The export is loaded with
``safetensors.numpy`` and run through a float64 numpy forward pass written from the Hugging Face Llama
definition (``modeling_llama.py``: embedding, RMSNorm, rotate-half RoPE, GQA by ``repeat_kv``, causal
softmax attention, SwiGLU, final norm, lm_head), reading every hyper-parameter from the exported
``config.json``; its logits must match tidal's own JAX forward pass within 1e-4.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest
from test_train_e2e import CONFIG, committed_inputs, fast_subprocesses  # noqa: F401

from tidal.cli import main
from tidal.core.runner import run_step
from tidal.steps import Step
from tidal.train.config import ConfigError, TrainConfig
from tidal.train.sample import Sampling, generate, nucleus_choice, sample
from tidal.train.trained import load_trained

MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64}
INPUT_NAMES = ("train_data", "eval_data", "tokenizer")
PROMPT = "cfi"  # three one-letter tokens of the test vocabulary


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """(storage, train step id, its directory, tokenizer step dir) of a committed 8-step run."""
    root = tmp_path_factory.mktemp("export")
    storage, inputs = committed_inputs(root)
    fields = {k: v for k, v in CONFIG.items() if k not in INPUT_NAMES} | {
        "model": MODEL, "steps": 8, "checkpoint_every": 4, "eval_every": 4, "keep_checkpoints": 2}
    config = {"seed": 5, **TrainConfig.model_validate(fields).model_dump(), **{k: CONFIG[k] for k in INPUT_NAMES}}
    train = Step("train", "train", config, inputs=inputs)
    run_step(train, storage)
    assert storage.is_committed(train.step_id)
    return storage, train.step_id, storage.step_dir(train.step_id), storage.step_dir(inputs[0].step_id)


def hf_llama_logits(tensors: dict[str, np.ndarray], config: dict, ids: np.ndarray) -> np.ndarray:
    """Logits ``[T, V]`` of token ids ``[T]`` by the Hugging Face Llama forward pass, in float64 numpy."""
    w = {name: value.astype(np.float64) for name, value in tensors.items()}
    h, kvh, dh = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    eps, theta, t = config["rms_norm_eps"], config["rope_theta"], len(ids)

    def rms_norm(x, weight):  # LlamaRMSNorm
        return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))

    def rotate_half(x):
        return np.concatenate([-x[..., dh // 2:], x[..., : dh // 2]], axis=-1)

    inv_freq = 1.0 / theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh)  # LlamaRotaryEmbedding
    freqs = np.outer(np.arange(t, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[None], np.sin(emb)[None]  # [1, T, dh]
    causal = np.triu(np.ones((t, t), dtype=bool), k=1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, w[p + "input_layernorm.weight"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).reshape(t, h, dh).transpose(1, 0, 2)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).reshape(t, kvh, dh).transpose(1, 0, 2)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).reshape(t, kvh, dh).transpose(1, 0, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin  # apply_rotary_pos_emb
        k, v = np.repeat(k, h // kvh, axis=0), np.repeat(v, h // kvh, axis=0)  # repeat_kv
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
        scores[:, causal] = -np.inf
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = (probs @ v).transpose(1, 0, 2).reshape(t, h * dh)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"])
        gate = m @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((gate / (1.0 + np.exp(-gate))) * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"])
    lm_head = w["model.embed_tokens.weight"] if config["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ lm_head.T


def llama_names(n_layers: int) -> set[str]:
    per_layer = ["input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    return ({"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
            | {f"model.layers.{i}.{name}.weight" for i in range(n_layers) for name in per_layer})


def test_hf_export_matches_tidal_logits(committed, tmp_path, capsys):
    from safetensors.numpy import load_file

    storage, step_id, step_dir, tok_dir = committed
    out = tmp_path / "hf"
    started = time.perf_counter()
    assert main(["export", step_id, "--format", "hf", "--out", str(out), "--storage-root", str(storage.root)]) == 0
    seconds = time.perf_counter() - started
    assert f"exported {step_id} checkpoint 8" in capsys.readouterr().out
    summary = json.loads((step_dir / "summary.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 8)
    assert config["tie_word_embeddings"] is False and config["vocab_size"] == 64
    assert config["tidal"]["checkpoint_root_hash"] == summary["checkpoint_root_hash"]
    assert config["tidal"]["step_id"] == step_id and config["tidal"]["checkpoint_step"] == 8
    record = json.loads((out / "tidal_export.json").read_text())
    assert record["checkpoint_root_hash"] == summary["checkpoint_root_hash"]
    assert (out / "tokenizer.json").read_bytes() == (tok_dir / "tokenizer.json").read_bytes()
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 0

    tensors = load_file(out / "model.safetensors")
    assert set(tensors) == llama_names(2)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (16, 32)  # [kv_heads * head_dim, d]
    assert tensors["model.layers.1.mlp.down_proj.weight"].shape == (32, 64)
    model = load_trained(step_dir)
    rows = np.random.default_rng(0).integers(0, 64, size=(3, 32))
    ours = model.logits(rows)
    worst = 0.0
    for row, logits in zip(rows, ours, strict=True):
        reference = hf_llama_logits(tensors, config, row)
        worst = max(worst, float(np.max(np.abs(reference - logits))))
    print(f"export {seconds:.2f} s; max |HF numpy logits - tidal logits| = {worst:.3g}")
    assert worst < 1e-4, worst
    assert float(np.std(ours)) > 0.1  # a trained model, not constant logits

    again = tmp_path / "hf-again"
    assert main(["export", str(step_dir), "--out", str(again)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in again.iterdir()}
    assert main(["verify", str(step_dir)]) == 0  # nothing in the committed step was written


def test_export_refuses_moe_and_targets_that_are_no_train_step(committed, tmp_path, capsys):
    from tidal.train.flops import MoEConfig
    from tidal.train.hf_export import export_hf

    _, _, step_dir, tok_dir = committed
    model = load_trained(step_dir)
    moe = dataclasses.replace(model, shape=model.shape.model_copy(update={"moe": MoEConfig(n_experts=2)}))
    with pytest.raises(ConfigError, match="config.model.moe: a mixture-of-experts model has no Llama layout"):
        export_hf(moe, tmp_path / "moe")
    assert not (tmp_path / "moe").exists()
    older = load_trained(step_dir, checkpoint=4)  # keep_checkpoints 2: steps 4 and 8 are kept
    assert older.checkpoint_step == 4 and not np.array_equal(older.params["lm_head"]["kernel"],
                                                              model.params["lm_head"]["kernel"])
    with pytest.raises(ConfigError, match=r"checkpoints/3: no such checkpoint; kept: \[4, 8\]"):
        load_trained(step_dir, checkpoint=3)
    capsys.readouterr()
    assert main(["export", str(tok_dir), "--out", str(tmp_path / "x")]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and "spec.json: missing" in line
    assert main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and "no such file or directory" in line
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep me")
    assert main(["export", str(step_dir), "--out", str(tmp_path / "full")]) == 1
    assert "holds no earlier export" in capsys.readouterr().err
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep me"


def test_export_to_an_existing_file_is_one_error_line(committed, tmp_path, capsys):
    """Issue 43, item 7: ``--out`` naming an existing file was a traceback."""
    _, _, step_dir, _ = committed
    (tmp_path / "model.bin").write_text("keep me")
    capsys.readouterr()
    assert main(["export", str(step_dir), "--out", str(tmp_path / "model.bin")]) == 2
    err = capsys.readouterr().err
    [line] = err.strip().splitlines()
    assert line.startswith("error: --out ") and "is a file" in line and "Traceback" not in err
    assert (tmp_path / "model.bin").read_text() == "keep me"


def test_greedy_is_the_argmax_of_the_forward_pass_step_by_step(committed):
    model = load_trained(committed[2])
    settings = Sampling.of(max_new_tokens=8)
    result = sample(model, PROMPT, settings)
    ids = list(result.prompt_ids)
    assert ids[0] == 0 and len(ids) == 4  # end-of-text, then the prompt's tokens
    for token in result.new_ids:  # each prefix at its own length, unpadded
        assert token == int(np.argmax(model.logits(np.array([ids]))[0, -1]))
        ids.append(token)
    assert len(result.new_ids) == 8 or result.stopped_at_eos
    assert result.text.startswith(PROMPT) and len(result.text) > len(PROMPT)


def test_seeded_sampling_is_deterministic_and_seeds_differ(committed, capsys):
    step_dir = str(committed[2])

    def run(seed: int) -> dict:
        assert main(["sample", step_dir, "--prompt", PROMPT, "--max-new-tokens", "16", "--temperature", "1.0",
                     "--top-p", "0.95", "--seed", str(seed), "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    first = run(1)
    assert first == run(1)
    assert first["settings"] == {"max_new_tokens": 16, "temperature": 1.0, "top_p": 0.95, "seed": 1}
    texts = {tuple(run(seed)["new_ids"]) for seed in (2, 3, 4)} | {tuple(first["new_ids"])}
    assert len(texts) > 1, texts
    assert main(["sample", step_dir, "--prompt", PROMPT, "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith(PROMPT)


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    logits = np.log(np.array([0.1, 0.5, 0.3, 0.1]))
    # top_p 0.75: {1, 2} (0.5 + 0.3 reach it, 0.5 does not); the uniform walks their renormalised CDF 0.625, 1.0
    assert [nucleus_choice(logits, 1.0, 0.75, u) for u in (0.0, 0.6, 0.63, 0.99)] == [1, 1, 2, 2]
    assert {nucleus_choice(logits, 1.0, 0.4, u) for u in np.linspace(0, 0.999, 20)} == {1}
    assert {nucleus_choice(logits, 1.0, 1.0, u) for u in np.linspace(0, 0.999, 50)} == {0, 1, 2, 3}


@pytest.mark.parametrize(("args", "message"), [
    (["--prompt", ""], "--prompt: empty"),
    (["--prompt", "   "], "--prompt: empty"),
    (["--prompt", PROMPT, "--top-p", "0"], "--top-p: must be in (0, 1], got 0.0"),
    (["--prompt", PROMPT, "--top-p", "1.5"], "--top-p: must be in (0, 1], got 1.5"),
    (["--prompt", PROMPT, "--temperature", "0"], "--temperature: must be a finite number above 0"),
    (["--prompt", PROMPT, "--max-new-tokens", "0"], "--max-new-tokens: must be at least 1"),
    (["--prompt", PROMPT, "--max-new-tokens", "40"], "exceed the 32 tokens the model was trained on"),
    (["--prompt", "~~~"], "encodes to no token"),
])
def test_bad_sample_input_is_one_error_line(committed, capsys, args, message):
    status = main(["sample", str(committed[2]), *args])
    [line] = capsys.readouterr().err.strip().splitlines()
    assert status in (1, 2) and line.startswith("error: ") and message in line, line


def test_generate_stops_at_end_of_text(committed):
    model = load_trained(committed[2])
    settings = Sampling.of(max_new_tokens=20)
    plain = generate(model, [0, 3, 6], settings)
    assert len(plain) == 20 and 0 not in plain  # greedy from this prompt never picks end-of-text (id 0) here
    # with the third greedy token declared end-of-text, generation stops right after it
    eos_model = dataclasses.replace(model, tokenizer_meta={**model.tokenizer_meta, "eos_id": plain[2]})
    assert generate(eos_model, [0, 3, 6], settings) == plain[: plain.index(plain[2]) + 1]


def test_read_only_commands_write_nothing_and_print_only_their_output(committed, tmp_path):
    """Issue 44: sample, export and verify on a committed step change no file of the storage root (orbax used
    to clean up "existing temporary directories" in the step's checkpoints), and sample prints its text with no
    library INFO lines around it unless --verbose."""
    import os
    import subprocess
    import sys

    storage, _, step_dir, _ = committed
    root = Path(storage.root)

    def tree() -> dict[str, tuple[int, int]]:
        return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}

    before = tree()
    command = [sys.executable, "-m", "tidal.cli", "sample", str(step_dir), "--prompt", PROMPT, "--max-new-tokens", "4"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=True)
    assert quiet.stdout.startswith(PROMPT) and len(quiet.stdout.splitlines()) <= 2, quiet.stdout
    assert not [line for line in quiet.stderr.splitlines() if " INFO " in line or line.startswith("I")], quiet.stderr
    verbose = subprocess.run([*command, "--verbose"], capture_output=True, text=True, timeout=300, env=env, check=True)
    assert verbose.stdout == quiet.stdout and len(verbose.stderr.splitlines()) > len(quiet.stderr.splitlines())
    assert main(["export", str(step_dir), "--out", str(tmp_path / "hf")]) == 0
    assert main(["verify", str(step_dir)]) == 0
    assert tree() == before
