"""A small Llama-style decoder-only transformer in flax.linen, its size and its FLOPs.

Architecture (every block pre-norm, no biases anywhere):

    tokens [B, T] --embed--> h [B, T, d]
    repeat n_layers:  h += Attn(RMSNorm(h))      causal multi-head self-attention with RoPE
                      h += SwiGLU(RMSNorm(h))    W_down(silu(W_gate x) * W_up x)
    logits [B, T, V] = LMHead(RMSNorm(h))        untied: the output matrix is its own parameter

Embeddings are **untied** (input embedding ``[V, d]`` and output head ``[d, V]`` are separate
parameters), as in Llama (Touvron et al. 2023). Activations and parameters are float32.

Its shape (:class:`ModelConfig`), parameter count and FLOPs formulas live in the JAX-free
:mod:`tidal.train.flops` (formula in its docstring) and are re-exported here.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from tidal.train.flops import ModelConfig, flops_per_token, param_count  # noqa: F401 (re-exported)

ROPE_BASE = 10_000.0
NORM_EPS = 1e-6
INIT_STD = 0.02


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
