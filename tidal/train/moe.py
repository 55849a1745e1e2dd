"""Mixture-of-experts feed-forward: top-k routing with expert capacity, by dense einsum dispatch.

Invariant: routing never looks ahead. Each sequence is one routing group and expert buffer
slots are filled in token order (all ``top_k`` choices of token t before any choice of token
t+1), so whether token t is dropped depends only on tokens ``<= t``: the model stays causal
(``tests/train/test_moe.py`` checks it). GShard (Lepikhin et al. 2020, Algorithm 2) and
Switch (Fedus et al. 2021) give priority to every token's first choice before any second
choice, which lets a later token's first choice evict an earlier token's second choice; in a
decoder that leaks the future, so tidal orders by position.

Per group of S tokens with router logits ``x [S, E]`` (float32 even under bf16 compute, the
"selective precision" of Zoph et al. 2022, "ST-MoE", §3.2):

* probabilities ``p = softmax(x)``; each token picks its ``top_k`` experts; the gates are
  ``p`` of the chosen experts, renormalised to sum to 1 when ``top_k > 1`` (GShard
  Algorithm 2) and left as is for ``top_k = 1`` (Switch §2.1, so the router gets gradient).
* capacity ``C = ceil(capacity_factor * S * top_k / E)`` slots per expert; a choice that
  finds its expert's C slots taken is dropped (that token skips that expert; the residual
  stream carries it) and counted in ``dropped_fraction``.
* load-balancing loss (Switch eq. 4): ``aux = E * sum_e f_e * P_e`` with ``f_e`` the fraction
  of the ``S * top_k`` choices sent to expert e (before dropping; for top_k = 1 exactly
  Switch's fraction of tokens) and ``P_e`` the mean router probability of e. It is 1 under
  uniform routing (the value it takes when ``f`` or ``P`` is uniform) and E when every token
  picks one expert with certainty.
* router z-loss (ST-MoE eq. 5): ``z = mean_tokens (logsumexp_e x)^2``.

Both losses are averaged over all groups (the batch) and over the MoE layers by
:func:`tidal.train.model.loss_and_metrics`, which adds ``aux_loss_weight * aux +
router_z_loss_weight * z`` to the cross-entropy.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from tidal.train.flops import ModelShape

INIT_STD = 0.02


class Routing(NamedTuple):
    """The routing of G groups of S tokens to E experts with C slots each.

    Attributes:
        dispatch: ``[G, S, E, C]`` float32 one-hot: token s fills slot c of expert e.
        combine: ``[G, S, E, C]`` float32: ``dispatch`` times the token's gate for e.
        expert_index: ``[G, S, k]`` int32 chosen experts (before dropping).
        kept: ``[G, S, k]`` bool, False where the choice was dropped for lack of capacity.
        aux_loss: scalar, Switch load-balancing loss over all G*S tokens.
        z_loss: scalar, ST-MoE router z-loss over all G*S tokens.
        dropped_fraction: scalar, dropped choices / (G * S * k).
    """

    dispatch: jax.Array
    combine: jax.Array
    expert_index: jax.Array
    kept: jax.Array
    aux_loss: jax.Array
    z_loss: jax.Array
    dropped_fraction: jax.Array


def route(router_logits: jax.Array, top_k: int, capacity: int) -> Routing:
    """Top-k routing with capacity, in token order (module docstring gives the rules).

    Args:
        router_logits: ``[G, S, E]`` float32 logits (a group is one sequence).
        top_k: experts per token, ``1 <= top_k <= E``.
        capacity: C, slots per expert per group.

    Returns:
        A :class:`Routing`.
    """
    logits = router_logits.astype(jnp.float32)
    g, s, e = logits.shape
    probs = jax.nn.softmax(logits, axis=-1)
    gates, expert_index = jax.lax.top_k(probs, top_k)  # [G, S, k]
    if top_k > 1:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    choice = jax.nn.one_hot(expert_index, e, dtype=jnp.int32)  # [G, S, k, E]
    in_order = choice.reshape(g, s * top_k, e)  # token-major: (s0 k0, s0 k1, s1 k0, ...)
    slot = jnp.cumsum(in_order, axis=1) - 1  # slot the choice takes in its expert's buffer
    kept_flat = (in_order == 1) & (slot < capacity)
    slot_onehot = jax.nn.one_hot(jnp.where(kept_flat, slot, -1), capacity, dtype=jnp.float32)  # [G, S*k, E, C]
    slot_onehot = slot_onehot.reshape(g, s, top_k, e, capacity)
    dispatch = slot_onehot.sum(axis=2)  # a token's k choices are k different experts
    combine = jnp.einsum("gskec,gsk->gsec", slot_onehot, gates)
    kept = kept_flat.reshape(g, s, top_k, e).any(axis=-1)
    fraction = choice.sum(axis=(0, 1, 2)).astype(jnp.float32) / (g * s * top_k)  # f_e
    mean_prob = probs.mean(axis=(0, 1))  # P_e
    aux_loss = e * jnp.sum(fraction * mean_prob)
    z_loss = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    dropped_fraction = 1.0 - kept.sum().astype(jnp.float32) / (g * s * top_k)
    return Routing(dispatch, combine, expert_index, kept, aux_loss, z_loss, dropped_fraction)


class MoEFeedForward(nn.Module):
    """E SwiGLU experts behind a top-k router: ``[B, T, d] -> [B, T, d]``.

    Parameters: ``router/kernel [d, E]``, ``w_gate [E, d, d_ff]``, ``w_up [E, d, d_ff]``,
    ``w_down [E, d_ff, d]`` (float32, normal(0.02) like the dense layers). Sows
    ``aux_loss``, ``z_loss`` and ``dropped_fraction`` (scalars) into the ``"moe"`` collection.
    """

    cfg: ModelShape

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        moe = self.cfg.moe
        _, t, d = x.shape
        e, f = moe.n_experts, self.cfg.d_ff
        init = nn.initializers.normal(INIT_STD)
        router = nn.Dense(e, use_bias=False, kernel_init=init, name="router")
        routing = route(router(x.astype(jnp.float32)), moe.top_k, moe.capacity(t))
        w_gate = self.param("w_gate", init, (e, d, f), jnp.float32)
        w_up = self.param("w_up", init, (e, d, f), jnp.float32)
        w_down = self.param("w_down", init, (e, f, d), jnp.float32)
        dtype = x.dtype
        expert_in = jnp.einsum("btec,btd->becd", routing.dispatch.astype(dtype), x)
        gate = jnp.einsum("becd,edf->becf", expert_in, w_gate.astype(dtype))
        up = jnp.einsum("becd,edf->becf", expert_in, w_up.astype(dtype))
        expert_out = jnp.einsum("becf,efd->becd", nn.silu(gate) * up, w_down.astype(dtype))
        self.sow("moe", "aux_loss", routing.aux_loss)
        self.sow("moe", "z_loss", routing.z_loss)
        self.sow("moe", "dropped_fraction", routing.dropped_fraction)
        return jnp.einsum("btec,becd->btd", routing.combine.astype(dtype), expert_out)
