"""``tidal export STEP --format hf``: a train step's checkpoint as a Hugging Face ``LlamaForCausalLM``.

tidal's transformer (:mod:`tidal.train.model`) is the Llama architecture, so the export is a renaming
and a transpose, no arithmetic::

    embed/embedding [V, d]              -> model.embed_tokens.weight [V, d]
    block_i/attn_norm/scale [d]         -> model.layers.i.input_layernorm.weight
    block_i/attn/w_q/kernel [d, h*dh]   -> model.layers.i.self_attn.q_proj.weight [h*dh, d]   (transposed)
    block_i/attn/w_k/kernel [d, kvh*dh] -> model.layers.i.self_attn.k_proj.weight [kvh*dh, d] (transposed)
    block_i/attn/w_v/kernel [d, kvh*dh] -> model.layers.i.self_attn.v_proj.weight [kvh*dh, d] (transposed)
    block_i/attn/w_o/kernel [h*dh, d]   -> model.layers.i.self_attn.o_proj.weight [d, h*dh]   (transposed)
    block_i/mlp_norm/scale [d]          -> model.layers.i.post_attention_layernorm.weight
    block_i/mlp/w_gate/kernel [d, f]    -> model.layers.i.mlp.gate_proj.weight [f, d]         (transposed)
    block_i/mlp/w_up/kernel [d, f]      -> model.layers.i.mlp.up_proj.weight [f, d]           (transposed)
    block_i/mlp/w_down/kernel [f, d]    -> model.layers.i.mlp.down_proj.weight [d, f]         (transposed)
    final_norm/scale [d]                -> model.norm.weight
    lm_head/kernel [d, V]               -> lm_head.weight [V, d]                              (transposed)

A flax ``Dense`` kernel is ``[in, out]`` and a torch ``Linear`` weight ``[out, in]``: hence the
transposes. No q/k row permutation is needed: tidal's RoPE is already the rotate-half (half-split)
form with HF's frequencies ``theta**(-2i/dh)`` (:func:`tidal.train.model.rope`), and both split the
projection's output into heads head-major (``reshape(..., h, dh)``, HF's ``view``). Grouped-query
attention maps directly (query head j reads key/value head ``j // (h / kvh)`` in both, HF's
``repeat_kv``). RMSNorm ``x * rsqrt(mean(x^2) + eps) * w`` with ``eps`` 1e-6, no biases, untied
embeddings (``tie_word_embeddings: false``). Mixture-of-experts models are refused: tidal's routing
(capacity per sequence, dropped choices) is not Mixtral's.

Files written into the output directory (the same checkpoint gives the same bytes): ``model.safetensors``
(float32), ``config.json`` (with a ``tidal`` block: step id, checkpoint step and root hash, tokenizer
hash), ``generation_config.json``, ``tokenizer.json`` (the tokenizer step's file, byte for byte),
``tokenizer_config.json``, ``special_tokens_map.json`` and, last, ``tidal_export.json`` (the same
record plus the sha256 of every other file).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from tidal.storage.layout import atomic_write_bytes
from tidal.train.config import ConfigError
from tidal.train.model import INIT_STD, NORM_EPS, ROPE_BASE
from tidal.train.trained import TOKENIZER_FILE, TrainedModel

EXPORT_RECORD = "tidal_export.json"
WEIGHTS = "model.safetensors"
FORMAT_VERSION = 1

_LAYER = {  # flax path under block_i -> (HF name under model.layers.i, transpose)
    ("attn_norm", "scale"): ("input_layernorm.weight", False),
    ("attn", "w_q", "kernel"): ("self_attn.q_proj.weight", True),
    ("attn", "w_k", "kernel"): ("self_attn.k_proj.weight", True),
    ("attn", "w_v", "kernel"): ("self_attn.v_proj.weight", True),
    ("attn", "w_o", "kernel"): ("self_attn.o_proj.weight", True),
    ("mlp_norm", "scale"): ("post_attention_layernorm.weight", False),
    ("mlp", "w_gate", "kernel"): ("mlp.gate_proj.weight", True),
    ("mlp", "w_up", "kernel"): ("mlp.up_proj.weight", True),
    ("mlp", "w_down", "kernel"): ("mlp.down_proj.weight", True),
}
_TOP = {
    ("embed", "embedding"): ("model.embed_tokens.weight", False),
    ("final_norm", "scale"): ("model.norm.weight", False),
    ("lm_head", "kernel"): ("lm_head.weight", True),
}


def hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """The Hugging Face Llama name of a flax parameter path and whether it is transposed.

    Raises:
        KeyError: a parameter the Llama layout has no place for.
    """
    if path in _TOP:
        return _TOP[path]
    if path[0].startswith("block_") and path[1:] in _LAYER:
        name, transpose = _LAYER[path[1:]]
        return f"model.layers.{int(path[0][len('block_'):])}.{name}", transpose
    raise KeyError(f"parameter {'/'.join(path)} has no Hugging Face Llama name")


def hf_tensors(params: Any) -> dict[str, np.ndarray]:
    """Every parameter of ``params`` (the flax tree) under its HF name, float32, C-contiguous
    (``[out, in]`` for projections: the module docstring's table)."""
    from flax.traverse_util import flatten_dict

    out: dict[str, np.ndarray] = {}
    for path, value in sorted(flatten_dict(params).items()):
        name, transpose = hf_name(tuple(path))
        array = np.asarray(value, dtype=np.float32)
        out[name] = np.ascontiguousarray(array.T if transpose else array)
    return out


def hf_config(model: TrainedModel) -> dict[str, Any]:
    """``config.json`` of the export: ``LlamaForCausalLM`` with the model's shape, plus the ``tidal`` block."""
    s, eos = model.shape, int(model.tokenizer_meta.get("eos_id", 0))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": s.vocab_size, "hidden_size": s.d_model, "intermediate_size": s.d_ff,
        "num_hidden_layers": s.n_layers, "num_attention_heads": s.n_heads, "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim, "hidden_act": "silu", "rms_norm_eps": NORM_EPS, "rope_theta": ROPE_BASE,
        "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_BASE},  # v5 name
        "max_position_embeddings": model.context or 2048, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": INIT_STD,
        "pretraining_tp": 1, "use_cache": True, "torch_dtype": "float32",
        "bos_token_id": eos, "eos_token_id": eos,
        "tidal": provenance(model),
    }


def provenance(model: TrainedModel) -> dict[str, Any]:
    """What the export was made from: step id, checkpoint step and root hash, tokenizer hash."""
    return {"format_version": FORMAT_VERSION, "step_id": model.step_id, "checkpoint_step": model.checkpoint_step,
            "checkpoint_root_hash": model.checkpoint_root_hash,
            "tokenizer_hash": model.tokenizer_meta["tokenizer_hash"],
            "compute_dtype": model.shape.compute_dtype}


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def export_hf(model: TrainedModel, out: str | Path) -> dict[str, Any]:
    """Write the Hugging Face export of ``model`` into ``out`` (created; an earlier export there is replaced).

    Returns:
        The ``tidal_export.json`` record: :func:`provenance` plus ``files`` (name -> sha256) and ``tensors``.

    Raises:
        ConfigError: a mixture-of-experts model; ``out`` is a non-empty directory holding no earlier export.
    """
    from safetensors.numpy import save

    if model.shape.moe is not None:
        raise ConfigError(f"{model.step_dir}: config.model.moe: a mixture-of-experts model has no Llama layout "
                          "(tidal routes with per-sequence capacity and drops choices; Mixtral does not); "
                          "export a dense model")
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not (out / EXPORT_RECORD).is_file():
        raise ConfigError(f"{out}: a non-empty directory that holds no earlier export ({EXPORT_RECORD}); "
                          "pass --out a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    tensors = hf_tensors(model.params)
    meta = model.tokenizer_meta
    eos_id = int(meta.get("eos_id", 0))
    eos = (meta.get("special_tokens") or ["<|endoftext|>"])[0]
    files = {
        WEIGHTS: save(tensors, metadata={"format": "pt"}),
        "config.json": _json(hf_config(model)),
        "generation_config.json": _json({"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": False,
                                         "max_length": model.context or 2048}),
        TOKENIZER_FILE: (model.tokenizer_dir / TOKENIZER_FILE).read_bytes(),
        "tokenizer_config.json": _json({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eos,
                                        "eos_token": eos, "add_bos_token": False, "add_eos_token": False,
                                        "clean_up_tokenization_spaces": False,
                                        "model_max_length": model.context or 2048}),
        "special_tokens_map.json": _json({"bos_token": eos, "eos_token": eos}),
    }
    for name, data in files.items():
        atomic_write_bytes(out / name, data)
    record = {**provenance(model), "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
              "tensors": {name: list(array.shape) for name, array in sorted(tensors.items())}}
    atomic_write_bytes(out / EXPORT_RECORD, _json(record))
    return record
