"""A Llama-style decoder-only transformer in flax.linen, its size and its FLOPs.

Architecture (every block pre-norm, no biases anywhere):

    tokens [B, T] --embed--> h [B, T, d]
    repeat n_layers:  h += Attn(RMSNorm(h))      causal self-attention with RoPE; multi-head, or
                                                 grouped-query with n_kv_heads < n_heads
                      h += FFN(RMSNorm(h))       SwiGLU W_down(silu(W_gate x) * W_up x), or a
                                                 mixture of SwiGLU experts (tidal.train.moe)
    logits [B, T, V] = LMHead(RMSNorm(h))        untied: the output matrix is its own parameter

Embeddings are **untied** (input embedding ``[V, d]`` and output head ``[d, V]`` are separate
parameters), as in Llama (Touvron et al. 2023). Parameters are float32; activations are float32
or, with ``compute_dtype: bfloat16``, bfloat16 (attention softmax, router and loss in float32).
With the defaults (``n_kv_heads == n_heads``, no MoE, float32) the computation is the original
one op for op, so existing step ids and checkpoints stay valid.

Its config (:class:`ModelConfig`; with the vocabulary size, :class:`ModelShape`), parameter count
and FLOPs formulas live in the JAX-free
:mod:`tidal.train.flops` (formula in its docstring) and are re-exported here.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.traverse_util import flatten_dict

from tidal.train.flops import (  # noqa: F401 (re-exported)
    ModelConfig,
    ModelShape,
    MoEConfig,
    flops_per_token,
    param_count,
)
from tidal.train.moe import MoEFeedForward

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


def _compute_dtype(cfg: ModelShape) -> Any:
    """flax ``dtype`` argument: None (float32, the original modules exactly) or bfloat16."""
    return None if cfg.compute_dtype == "float32" else jnp.dtype(cfg.compute_dtype)


def _dense(features: int, name: str, dtype: Any = None) -> nn.Dense:
    return nn.Dense(features, use_bias=False, kernel_init=nn.initializers.normal(INIT_STD), name=name,
                    dtype=dtype)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with RoPE, multi-head or grouped-query: ``[B, T, d] -> [B, T, d]``.

    Parameters ``w_q [d, d]``, ``w_k [d, kv]``, ``w_v [d, kv]``, ``w_o [d, d]`` with
    ``kv = kv_heads * head_dim``. With ``n_kv_heads < n_heads`` each key/value head serves
    ``n_heads / n_kv_heads`` consecutive query heads (Ainslie et al. 2023, "GQA").
    """

    cfg: ModelShape

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h, kvh, dh = self.cfg.n_heads, self.cfg.kv_heads, self.cfg.head_dim
        dtype = _compute_dtype(self.cfg)
        q = rope(_dense(d, "w_q", dtype)(x).reshape(b, t, h, dh))
        k = rope(_dense(kvh * dh, "w_k", dtype)(x).reshape(b, t, kvh, dh))
        v = _dense(kvh * dh, "w_v", dtype)(x).reshape(b, t, kvh, dh)
        if self.cfg.attention != "einsum":
            out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=self.cfg.attention)
            return _dense(d, "w_o", dtype)(out.reshape(b, t, d))
        if kvh != h:  # query head j reads key/value head j // (h / kvh)
            k, v = jnp.repeat(k, h // kvh, axis=2), jnp.repeat(v, h // kvh, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(dh))
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal[None, None], scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return _dense(d, "w_o", dtype)(out)


class SwiGLU(nn.Module):
    """Gated MLP ``W_down(silu(W_gate x) * W_up x)`` (Shazeer 2020): ``[B, T, d] -> [B, T, d]``."""

    cfg: ModelShape

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = _compute_dtype(self.cfg)
        gate = _dense(self.cfg.d_ff, "w_gate", dtype)(x)
        up = _dense(self.cfg.d_ff, "w_up", dtype)(x)
        return _dense(self.cfg.d_model, "w_down", dtype)(nn.silu(gate) * up)


class Block(nn.Module):
    """One pre-norm transformer block: ``[B, T, d] -> [B, T, d]``; ``use_moe`` picks the FFN."""

    cfg: ModelShape
    use_moe: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = _compute_dtype(self.cfg)
        attn_in = nn.RMSNorm(epsilon=NORM_EPS, name="attn_norm", dtype=dtype)(x)
        x = x + CausalSelfAttention(self.cfg, name="attn")(attn_in)
        mlp_in = nn.RMSNorm(epsilon=NORM_EPS, name="mlp_norm", dtype=dtype)(x)
        if self.use_moe:
            return x + MoEFeedForward(self.cfg, name="moe")(mlp_in)
        return x + SwiGLU(self.cfg, name="mlp")(mlp_in)


class Transformer(nn.Module):
    """Decoder-only language model: token ids ``[B, T]`` (int) -> logits ``[B, T, V]``.

    Logits are float32, or bfloat16 under ``compute_dtype: bfloat16`` (the loss casts them).
    """

    cfg: ModelShape

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        dtype = _compute_dtype(self.cfg)
        embed = nn.Embed(self.cfg.vocab_size, self.cfg.d_model,
                         embedding_init=nn.initializers.normal(INIT_STD), name="embed", dtype=dtype)
        x = embed(tokens)
        block = nn.remat(Block) if self.cfg.remat else Block
        for i in range(self.cfg.n_layers):
            use_moe = self.cfg.moe is not None and self.cfg.moe.is_moe_layer(i)
            x = block(self.cfg, use_moe, name=f"block_{i}")(x)
        x = nn.RMSNorm(epsilon=NORM_EPS, name="final_norm", dtype=dtype)(x)
        return _dense(self.cfg.vocab_size, "lm_head", dtype)(x)


def init_params(cfg: ModelShape, key: jax.Array, seq_len: int) -> Any:
    """Initial parameter pytree for :class:`Transformer` (shapes do not depend on ``seq_len``)."""
    return Transformer(cfg).init(key, jnp.zeros((1, seq_len), jnp.int32))["params"]


def loss_and_metrics(params: Any, cfg: ModelShape, batch: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Training loss and its parts, for logging.

    ``loss = ce + aux_loss_weight * moe_aux + router_z_loss_weight * router_z`` with MoE, else
    ``loss = ce``. ``moe_aux`` (Switch load-balancing loss, Fedus et al. 2021 eq. 4) and
    ``router_z`` (ST-MoE router z-loss, Zoph et al. 2022 eq. 5) are means over the MoE layers;
    ``dropped_fraction`` is the mean over MoE layers of the fraction of (token, expert)
    choices dropped for lack of expert capacity (see :mod:`tidal.train.moe`).

    Args:
        batch: ``[B, S]`` int token ids; inputs are ``batch[:, :-1]``, targets ``batch[:, 1:]``,
            so ``B * (S - 1)`` tokens are predicted.

    Returns:
        ``(loss, {"ce", "moe_aux", "router_z", "dropped_fraction"})``: float32 scalars; ``ce``
        is the mean next-token cross-entropy in nats per token; the MoE entries are 0 without MoE.
    """
    inputs, targets = batch[:, :-1], batch[:, 1:]
    model = Transformer(cfg)
    zero = jnp.zeros((), jnp.float32)
    if cfg.n_moe_layers:
        logits, state = model.apply({"params": params}, inputs, mutable=["moe"])
        sown = flatten_dict(state["moe"])
        def layer_mean(name: str) -> jax.Array:
            return jnp.mean(jnp.stack([v for path, values in sown.items() if path[-1] == name for v in values]))
        aux, z, dropped = layer_mean("aux_loss"), layer_mean("z_loss"), layer_mean("dropped_fraction")
    else:
        logits = model.apply({"params": params}, inputs)
        aux = z = dropped = zero
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    ce = losses.mean()
    loss = ce
    if cfg.n_moe_layers:
        loss = ce + cfg.moe.aux_loss_weight * aux + cfg.moe.router_z_loss_weight * z
    return loss, {"ce": ce, "moe_aux": aux, "router_z": z, "dropped_fraction": dropped}


def next_token_loss(params: Any, cfg: ModelShape, batch: jax.Array) -> jax.Array:
    """The training loss: mean next-token cross-entropy in nats per token, plus the MoE terms.

    Equal to ``loss_and_metrics(params, cfg, batch)[0]``; without MoE it is the plain
    cross-entropy.

    Args:
        batch: ``[B, S]`` int token ids; inputs are ``batch[:, :-1]``, targets ``batch[:, 1:]``,
            so ``B * (S - 1)`` tokens are predicted.

    Returns:
        Scalar float32 loss.
    """
    return loss_and_metrics(params, cfg, batch)[0]
