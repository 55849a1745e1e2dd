"""A small Llama-style decoder-only transformer in flax.linen, its size and its FLOPs.

Architecture (every block pre-norm, no biases anywhere):

    tokens [B, T] --embed--> h [B, T, d]
    repeat n_layers:  h += Attn(RMSNorm(h))      causal multi-head self-attention with RoPE
                      h += SwiGLU(RMSNorm(h))    W_down(silu(W_gate x) * W_up x)
    logits [B, T, V] = LMHead(RMSNorm(h))        untied: the output matrix is its own parameter

Embeddings are **untied** (input embedding ``[V, d]`` and output head ``[d, V]`` are separate
parameters), as in Llama (Touvron et al. 2023). Activations and parameters are float32.

Parameter count (exact for this module; checked by ``tests/train/test_model.py``)::

    N = V*d                      input embedding
      + L * (4*d*d               W_q, W_k, W_v, W_o   (n_heads * head_dim == d)
             + 3*d*d_ff          W_gate, W_up, W_down
             + 2*d)              two RMSNorm scales
      + d                        final RMSNorm scale
      + d*V                      untied output head
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

ROPE_BASE = 10_000.0
NORM_EPS = 1e-6
INIT_STD = 0.02


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer.

    Attributes:
        vocab_size: V, number of token ids (from the tokenizer's ``tokenizer_meta.json``).
        d_model: d, width of the residual stream.
        n_layers: L, number of transformer blocks.
        n_heads: attention heads; ``d_model % n_heads == 0`` and the head dim is even (RoPE).
        d_ff: hidden width of the SwiGLU MLP.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int

    @property
    def head_dim(self) -> int:
        """Per-head width ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @classmethod
    def from_config(cls, model: dict[str, Any], vocab_size: int) -> ModelConfig:
        """Build from the recipe's ``config["model"]`` = ``{d_model, n_layers, n_heads, d_ff}``.

        Raises:
            ValueError: naming the missing/unknown key or the violated rule (positive ints,
                ``d_model`` divisible by ``n_heads``, even head dim for RoPE).
        """
        keys = ("d_model", "n_layers", "n_heads", "d_ff")
        missing = [k for k in keys if k not in model]
        unknown = sorted(set(model) - set(keys))
        if missing or unknown:
            raise ValueError(f"train config 'model': missing keys {missing}, unknown keys {unknown}; "
                             f"expected exactly {list(keys)}")
        values = {k: model[k] for k in keys} | {"vocab_size": vocab_size}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"train config 'model.{key}' must be a positive int, got {value!r}")
        cfg = cls(**values)
        if cfg.d_model % cfg.n_heads or cfg.head_dim % 2:
            raise ValueError(f"train config 'model': d_model={cfg.d_model} must be divisible by "
                             f"n_heads={cfg.n_heads} with an even head dim (RoPE rotates pairs)")
        return cfg


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters N of :class:`Transformer` (formula in the module docstring)."""
    d, v = cfg.d_model, cfg.vocab_size
    return v * d + cfg.n_layers * (4 * d * d + 3 * d * cfg.d_ff + 2 * d) + d + d * v


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward) for context length ``seq_len`` tokens.

    ``6 * N_matmul + 12 * L * d * T``: 2 FLOPs per multiply-add per matmul parameter in the
    forward pass and twice that in the backward pass (Kaplan et al. 2020, "Scaling Laws for
    Neural Language Models", Table 1: C_forward = 2N + 2 n_layer n_ctx d_attn), plus the
    attention score and value matmuls, 12 * L * H * Q * T with H * Q = d (Chowdhery et al.
    2022, "PaLM", Appendix B, the formula used for MFU). ``N_matmul`` counts only weights used
    in matmuls: every block's projections and the untied output head, not the input embedding
    (a lookup) nor the RMSNorm scales. The causal mask is not discounted, as in PaLM.

    Returns:
        FLOPs per trained token (an int).
    """
    d = cfg.d_model
    n_matmul = cfg.n_layers * (4 * d * d + 3 * d * cfg.d_ff) + d * cfg.vocab_size
    return 6 * n_matmul + 12 * cfg.n_layers * d * seq_len


def rope(x: jax.Array) -> jax.Array:
    """Rotary position embedding (Su et al. 2021, "RoFormer"), rotate-half (GPT-NeoX/Llama) form.

    Args:
        x: ``[B, T, H, Dh]`` queries or keys; position t is the index along axis 1.

    Returns:
        Same shape and dtype, pairs (i, i + Dh/2) rotated by angle ``t * ROPE_BASE**(-2i/Dh)``.
    """
    seq_len, head_dim = x.shape[1], x.shape[3]
    half = head_dim // 2
    inv_freq = ROPE_BASE ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # [T, Dh/2]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _dense(features: int, name: str) -> nn.Dense:
    return nn.Dense(features, use_bias=False, kernel_init=nn.initializers.normal(INIT_STD), name=name)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with RoPE: ``[B, T, d] -> [B, T, d]``."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h, dh = self.cfg.n_heads, self.cfg.head_dim
        q = rope(_dense(d, "w_q")(x).reshape(b, t, h, dh))
        k = rope(_dense(d, "w_k")(x).reshape(b, t, h, dh))
        v = _dense(d, "w_v")(x).reshape(b, t, h, dh)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(dh))
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal[None, None], scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return _dense(d, "w_o")(out)


class SwiGLU(nn.Module):
    """Gated MLP ``W_down(silu(W_gate x) * W_up x)`` (Shazeer 2020): ``[B, T, d] -> [B, T, d]``."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        gate = _dense(self.cfg.d_ff, "w_gate")(x)
        up = _dense(self.cfg.d_ff, "w_up")(x)
        return _dense(self.cfg.d_model, "w_down")(nn.silu(gate) * up)


class Block(nn.Module):
    """One pre-norm transformer block: ``[B, T, d] -> [B, T, d]``."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        attn_in = nn.RMSNorm(epsilon=NORM_EPS, name="attn_norm")(x)
        x = x + CausalSelfAttention(self.cfg, name="attn")(attn_in)
        mlp_in = nn.RMSNorm(epsilon=NORM_EPS, name="mlp_norm")(x)
        return x + SwiGLU(self.cfg, name="mlp")(mlp_in)


class Transformer(nn.Module):
    """Decoder-only language model: token ids ``[B, T]`` (int) -> logits ``[B, T, V]`` (float32)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        embed = nn.Embed(self.cfg.vocab_size, self.cfg.d_model,
                         embedding_init=nn.initializers.normal(INIT_STD), name="embed")
        x = embed(tokens)
        for i in range(self.cfg.n_layers):
            x = Block(self.cfg, name=f"block_{i}")(x)
        x = nn.RMSNorm(epsilon=NORM_EPS, name="final_norm")(x)
        return _dense(self.cfg.vocab_size, "lm_head")(x)


def init_params(cfg: ModelConfig, key: jax.Array, seq_len: int) -> Any:
    """Initial parameter pytree for :class:`Transformer` (shapes do not depend on ``seq_len``)."""
    return Transformer(cfg).init(key, jnp.zeros((1, seq_len), jnp.int32))["params"]


def next_token_loss(params: Any, cfg: ModelConfig, batch: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy in nats per token.

    Args:
        batch: ``[B, S]`` int token ids; inputs are ``batch[:, :-1]``, targets ``batch[:, 1:]``,
            so ``B * (S - 1)`` tokens are predicted.

    Returns:
        Scalar float32 loss.
    """
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = Transformer(cfg).apply({"params": params}, inputs)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    return losses.mean()
