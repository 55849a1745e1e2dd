"""Mixture of experts: routing, capacity dropping, the auxiliary losses, causality, checkpoints."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tidal.train.flops import ModelConfig, ModelShape, MoEConfig, flops_per_token, param_count
from tidal.train.model import Transformer, init_params, loss_and_metrics, next_token_loss
from tidal.train.moe import MoEFeedForward, route

MOE = MoEConfig(n_experts=4, top_k=2, capacity_factor=1.0, aux_loss_weight=0.01, router_z_loss_weight=0.001,
                every=2)
CFG = ModelShape(vocab_size=40, d_model=16, n_layers=2, n_heads=4, d_ff=24, n_kv_heads=2, moe=MOE)


def replace(model, **changes):
    """A validated copy of a frozen config model with ``changes`` (``dataclasses.replace`` for pydantic)."""
    return type(model).model_validate(dict(model) | changes)


def _init(cfg, seed, seq_len):
    return jax.jit(lambda key: init_params(cfg, key, seq_len))(jax.random.key(seed))


def _logits(probs):
    return jnp.log(jnp.asarray(probs, jnp.float32))[None]  # one group


def test_top_k_selection_and_gates():
    probs = [[0.1, 0.6, 0.25, 0.05], [0.5, 0.1, 0.15, 0.25]]
    r = route(_logits(probs), top_k=2, capacity=4)
    np.testing.assert_array_equal(np.asarray(r.expert_index[0]), [[1, 2], [0, 3]])
    combine = np.asarray(r.combine[0]).sum(-1)  # [S, E]
    np.testing.assert_allclose(combine[0], [0, 0.6 / 0.85, 0.25 / 0.85, 0], rtol=1e-5)  # top-2 gates renormalised
    np.testing.assert_allclose(combine[1], [0.5 / 0.75, 0, 0, 0.25 / 0.75], rtol=1e-5)
    top1 = route(_logits(probs), top_k=1, capacity=4)  # Switch: the raw probability is the gate
    np.testing.assert_allclose(np.asarray(top1.combine[0]).sum(-1)[0], [0, 0.6, 0, 0], rtol=1e-5)
    assert float(r.dropped_fraction) == 0.0


def test_capacity_drops_in_token_order_and_counts_them():
    probs = [[0.9, 0.1]] * 4 + [[0.2, 0.8]]  # tokens 0-3 want expert 0, token 4 expert 1
    r = route(_logits(probs), top_k=1, capacity=2)
    np.testing.assert_array_equal(np.asarray(r.kept[0, :, 0]), [True, True, False, False, True])
    assert float(r.dropped_fraction) == pytest.approx(2 / 5)
    dispatch = np.asarray(r.dispatch[0])  # [S, E, C]
    assert dispatch[0, 0, 0] == 1 and dispatch[1, 0, 1] == 1 and dispatch[4, 1, 0] == 1
    assert dispatch[2].sum() == 0 and dispatch[3].sum() == 0 and dispatch.sum() == 3
    assert MoEConfig(n_experts=2, top_k=1, capacity_factor=0.8).capacity(5) == math.ceil(0.8 * 5 * 1 / 2)


def test_aux_and_z_loss_match_their_formulas_on_a_hand_case():
    probs = [[0.75, 0.25], [0.75, 0.25], [0.25, 0.75]]
    r = route(_logits(probs), top_k=1, capacity=3)
    f = np.array([2 / 3, 1 / 3])  # fraction of tokens routed to each expert
    p = np.array([(0.75 + 0.75 + 0.25) / 3, (0.25 + 0.25 + 0.75) / 3])  # mean router probability
    assert float(r.aux_loss) == pytest.approx(2 * float(f @ p), rel=1e-6)  # Switch eq. 4: E * sum f_e P_e
    assert float(r.aux_loss) == pytest.approx(19 / 18, rel=1e-6)
    # logits are log p, so logsumexp = log(sum p) = 0 here; shift them to test z-loss (ST-MoE eq. 5)
    shifted = route(_logits(probs) + 2.0, top_k=1, capacity=3)
    assert float(shifted.z_loss) == pytest.approx(4.0, rel=1e-6)
    assert float(shifted.aux_loss) == pytest.approx(float(r.aux_loss), rel=1e-6)


def test_aux_loss_is_one_when_uniform_e_when_collapsed_and_descends_to_balance():
    e, s = 4, 64
    uniform = route(jnp.zeros((2, s, e)), top_k=1, capacity=s)
    assert float(uniform.aux_loss) == pytest.approx(1.0) and float(uniform.z_loss) == pytest.approx(math.log(e) ** 2)
    collapsed = route(jnp.zeros((2, s, e)).at[..., 0].set(30.0), top_k=1, capacity=s)
    assert float(collapsed.aux_loss) == pytest.approx(e, rel=1e-4)
    # gradient descent on the aux loss alone spreads the tokens over the experts
    x = jax.random.normal(jax.random.key(0), (1, s, 8))
    router = (jax.random.normal(jax.random.key(1), (8, e)) * 0.1, jnp.array([3.0, 0.0, 0.0, 0.0]))
    aux = jax.jit(lambda r: route(x @ r[0] + r[1], 1, s).aux_loss)
    grad = jax.jit(jax.grad(lambda r: route(x @ r[0] + r[1], 1, s).aux_loss))
    before = float(aux(router))
    for _ in range(200):
        router = jax.tree.map(lambda w, g: w - 0.5 * g, router, grad(router))
    after = route(x @ router[0] + router[1], 1, s)
    load = np.bincount(np.asarray(after.expert_index).ravel(), minlength=e) / s
    assert before > 3.0 and float(after.aux_loss) < 1.1 and load.max() < 0.5


def test_moe_layer_equals_a_per_token_loop():
    cfg = replace(CFG, moe=replace(MOE, capacity_factor=0.5))
    x = jax.random.normal(jax.random.key(3), (2, 6, 16))
    variables = MoEFeedForward(cfg).init(jax.random.key(4), x)
    y = np.asarray(MoEFeedForward(cfg).apply(variables, x))
    p = jax.tree.map(np.asarray, variables["params"])
    r = route(jnp.asarray(x) @ p["router"]["kernel"], 2, cfg.moe.capacity(6))
    gates = np.asarray(r.combine).sum(-1)  # [B, T, E], zero where dropped
    assert 0 < float(r.dropped_fraction) < 1
    expect = np.zeros_like(y)
    for b in range(2):
        for t in range(6):
            for e in range(4):
                if gates[b, t, e]:
                    h = np.asarray(jax.nn.silu(x[b, t] @ p["w_gate"][e])) * (np.asarray(x[b, t]) @ p["w_up"][e])
                    expect[b, t] += gates[b, t, e] * (h @ p["w_down"][e])
    np.testing.assert_allclose(y, expect, rtol=1e-4, atol=1e-6)


def test_param_count_active_flops_and_causality_with_dropping():
    params = _init(CFG, 0, 10)
    assert sum(a.size for a in jax.tree.leaves(params)) == param_count(CFG)
    assert "moe" in params["block_1"] and "mlp" in params["block_0"]  # every=2: block 1 is MoE
    assert params["block_1"]["moe"]["w_gate"].shape == (4, 16, 24)
    d, v, f, kv, e, k, T = 16, 40, 24, 8, 4, 2, 10
    n_matmul = 2 * (2 * d * d + 2 * d * kv) + 3 * d * f + (k * 3 * d * f + d * e) + d * v
    assert flops_per_token(CFG, T) == 6 * n_matmul + 12 * 2 * d * T
    tight = replace(CFG, moe=replace(MOE, capacity_factor=0.5, every=1))
    params = _init(tight, 1, 10)
    x = jax.random.randint(jax.random.key(2), (2, 11), 0, 40)
    y = x.at[:, 6].set((x[:, 6] + 1) % 40)
    # rows are independent routing groups: one call computes both batches and the metrics
    (logits, metrics) = jax.jit(lambda p, b: (Transformer(tight).apply({"params": p}, b[:, :-1]),
                                              loss_and_metrics(p, tight, b)[1]))(params, jnp.concatenate([x, y]))
    lx, ly = np.asarray(logits[:2]), np.asarray(logits[2:])
    np.testing.assert_array_equal(lx[:, :6], ly[:, :6])
    assert not np.array_equal(lx[:, 6:], ly[:, 6:])
    assert float(metrics["dropped_fraction"]) > 0  # causality held although choices were dropped


def test_loss_includes_the_weighted_aux_terms_and_the_router_learns():
    params = _init(CFG, 5, 11)
    batch = jax.random.randint(jax.random.key(6), (4, 12), 0, 40)
    step = jax.value_and_grad(lambda p: loss_and_metrics(p, CFG, batch), has_aux=True)
    ((loss, m), grads), plain = jax.jit(lambda p: (step(p), next_token_loss(p, CFG, batch)))(params)
    assert float(loss) == pytest.approx(float(m["ce"] + 0.01 * m["moe_aux"] + 0.001 * m["router_z"]), rel=1e-6)
    assert float(m["moe_aux"]) >= 0.5 and float(m["router_z"]) > 0 and 0 <= float(m["dropped_fraction"]) < 1
    assert float(jnp.abs(grads["block_1"]["moe"]["router"]["kernel"]).sum()) > 0  # aux terms reach the router
    assert float(plain) == pytest.approx(float(loss), rel=1e-6)  # the trainer's loss includes the aux terms


def test_moe_params_checkpoint_bitwise_and_refuse_another_shape(tmp_path):
    params = _init(CFG, 7, 8)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "moe", params)
        ckpt.wait_until_finished()
        restored = ckpt.restore(tmp_path / "moe", jax.tree.map(ocp.utils.to_shape_dtype_struct, params))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        other = replace(CFG, moe=replace(MOE, n_experts=8))
        abstract = jax.eval_shape(lambda: init_params(other, jax.random.key(0), seq_len=8))
        with pytest.raises(ValueError, match="not compatible with the stored shape"):
            ckpt.restore(tmp_path / "moe", abstract)
        dense = jax.eval_shape(lambda: init_params(replace(CFG, moe=None), jax.random.key(0), 8))
        with pytest.raises(ValueError, match="[Ss]tructure"):
            ckpt.restore(tmp_path / "moe", dense)


@pytest.mark.parametrize("moe, rule", [
    ({"n_experts": 2, "top_k": 3}, "must not exceed"),
    ({"n_experts": 4, "capacity_factor": 0}, "capacity_factor"),
    ({"n_experts": 4, "experts": 2}, "moe.experts\n  Extra inputs are not permitted"),
    ({"top_k": 1}, "moe.n_experts\n  Field required"),
])
def test_moe_config_errors(moe, rule):
    with pytest.raises(ValueError, match=rule):
        ModelConfig.model_validate({"d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 8, "moe": moe})
