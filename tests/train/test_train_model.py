"""Model: parameter count formula, FLOPs formula, causality, config checks."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tidal.train.flops import PEAK_BF16_FLOPS, UnknownDeviceKind, mfu, peak_flops_per_s
from tidal.train.model import (
    CausalSelfAttention,
    ModelConfig,
    ModelShape,
    Transformer,
    flops_per_token,
    init_params,
    loss_and_metrics,
    next_token_loss,
    param_count,
    rope,
)

CFG = ModelShape(vocab_size=50, d_model=16, n_layers=2, n_heads=4, d_ff=40)


def replace(model, **changes):
    """A validated copy of a frozen config model with ``changes`` (``dataclasses.replace`` for pydantic)."""
    return type(model).model_validate(dict(model) | changes)


def test_param_count_matches_initialised_params():
    params = init_params(CFG, jax.random.key(0), seq_len=8)
    actual = sum(x.size for x in jax.tree.leaves(params))
    assert actual == param_count(CFG)
    d, v, L, f = 16, 50, 2, 40
    assert param_count(CFG) == 2 * v * d + L * (4 * d * d + 3 * d * f + 2 * d) + d
    assert params["embed"]["embedding"].shape == (v, d)  # untied: separate output head
    assert params["lm_head"]["kernel"].shape == (d, v)


def test_flops_per_token_formula():
    d, v, L, f, T = 16, 50, 2, 40, 128
    n_matmul = L * (4 * d * d + 3 * d * f) + d * v
    assert flops_per_token(CFG, T) == 6 * n_matmul + 12 * L * d * T


def test_causal_and_loss_shape():
    params = init_params(CFG, jax.random.key(1), seq_len=8)
    x = jnp.arange(8, dtype=jnp.int32)[None] % 50
    y = x.at[0, 6].set(49)
    lx = Transformer(CFG).apply({"params": params}, x)
    ly = Transformer(CFG).apply({"params": params}, y)
    assert lx.shape == (1, 8, 50)
    np.testing.assert_array_equal(np.asarray(lx[0, :6]), np.asarray(ly[0, :6]))
    assert not np.array_equal(np.asarray(lx[0, 6:]), np.asarray(ly[0, 6:]))
    loss = next_token_loss(params, CFG, jnp.tile(x, (3, 1)))
    assert loss.shape == () and abs(float(loss) - np.log(50)) < 0.5  # near-uniform at init


@pytest.mark.parametrize("model, rule", [
    ({"d_model": 16, "n_layers": 2, "n_heads": 3, "d_ff": 8}, "divisible"),
    ({"d_model": 16, "n_layers": 2, "n_heads": 16, "d_ff": 8}, "head dim d_model / n_heads = 1 must be even"),
    ({"d_model": 16, "n_layers": 0, "n_heads": 2, "d_ff": 8}, "n_layers\n  Input should be greater than 0"),
    ({"d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 8, "vocab_size": 50}, "vocab_size\n  Extra inputs"),
])
def test_model_config_errors(model, rule):
    with pytest.raises(ValueError, match=rule):
        ModelConfig.model_validate(model).shape(50)


# --- grouped-query attention, compute dtype, attention implementations, remat ----------------


class _OriginalAttention(nn.Module):
    """The multi-head attention of tidal before GQA existed (commit 6608e72), verbatim."""

    cfg: ModelShape

    @nn.compact
    def __call__(self, x):
        b, t, d = x.shape
        h, dh = self.cfg.n_heads, self.cfg.head_dim
        dense = lambda name: nn.Dense(d, use_bias=False, kernel_init=nn.initializers.normal(0.02), name=name)
        q = rope(dense("w_q")(x).reshape(b, t, h, dh))
        k = rope(dense("w_k")(x).reshape(b, t, h, dh))
        v = dense("w_v")(x).reshape(b, t, h, dh)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(dh))
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(causal[None, None], scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return dense("w_o")(out)


def _x(shape, seed=0):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def test_gqa_with_all_kv_heads_is_the_original_mha_bitwise():
    cfg = ModelShape(vocab_size=50, d_model=32, n_layers=1, n_heads=4, d_ff=64, n_kv_heads=4)
    x = _x((2, 9, 32))
    params = CausalSelfAttention(cfg).init(jax.random.key(1), x)
    new = jax.jit(CausalSelfAttention(cfg).apply)(params, x)
    old = jax.jit(_OriginalAttention(cfg).apply)(params, x)
    np.testing.assert_array_equal(np.asarray(new), np.asarray(old))
    assert replace(cfg, n_kv_heads=None).kv_heads == cfg.kv_heads == 4  # None means n_heads


def test_gqa_equals_mha_with_each_kv_head_repeated_over_its_group():
    gqa = ModelShape(vocab_size=50, d_model=32, n_layers=1, n_heads=4, d_ff=64, n_kv_heads=2)
    mha = replace(gqa, n_kv_heads=4)
    x = _x((2, 7, 32))
    params = CausalSelfAttention(gqa).init(jax.random.key(2), x)["params"]
    assert params["w_k"]["kernel"].shape == (32, 16) and params["w_q"]["kernel"].shape == (32, 32)
    dh = gqa.head_dim

    def expand(kernel):  # [d, kv*dh] -> [d, h*dh], query head j uses kv head j // 2
        return jnp.repeat(kernel.reshape(32, 2, dh), 2, axis=1).reshape(32, 4 * dh)

    mha_params = dict(params, w_k={"kernel": expand(params["w_k"]["kernel"])},
                      w_v={"kernel": expand(params["w_v"]["kernel"])})
    out_gqa = CausalSelfAttention(gqa).apply({"params": params}, x)
    out_mha = CausalSelfAttention(mha).apply({"params": mha_params}, x)
    np.testing.assert_allclose(np.asarray(out_gqa), np.asarray(out_mha), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_gqa_param_count_and_causality(n_kv_heads):
    cfg = ModelShape(vocab_size=50, d_model=16, n_layers=2, n_heads=4, d_ff=40, n_kv_heads=n_kv_heads)
    params = init_params(cfg, jax.random.key(0), seq_len=8)
    assert sum(x.size for x in jax.tree.leaves(params)) == param_count(cfg)
    d, v, L, f, kv = 16, 50, 2, 40, n_kv_heads * 4
    assert param_count(cfg) == 2 * v * d + L * (2 * d * d + 2 * d * kv + 3 * d * f + 2 * d) + d
    x = jnp.arange(8, dtype=jnp.int32)[None] % 50
    lx = Transformer(cfg).apply({"params": params}, x)
    ly = Transformer(cfg).apply({"params": params}, x.at[0, 5].set(49))
    np.testing.assert_array_equal(np.asarray(lx[0, :5]), np.asarray(ly[0, :5]))
    assert not np.array_equal(np.asarray(lx[0, 5:]), np.asarray(ly[0, 5:]))


def test_gqa_config_rules():
    cfg = ModelConfig.model_validate({"d_model": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "d_ff": 8})
    assert cfg.n_kv_heads == cfg.kv_heads == 2 and cfg.kv_dim == 16 and cfg.shape(50).kv_dim == 16
    with pytest.raises(ValueError, match="must divide n_heads"):
        ModelConfig.model_validate({"d_model": 32, "n_layers": 1, "n_heads": 4, "n_kv_heads": 3, "d_ff": 8})
    with pytest.raises(ValueError, match="kv_heads\n  Extra inputs are not permitted"):
        ModelConfig.model_validate({"d_model": 32, "n_layers": 1, "n_heads": 4, "d_ff": 8, "kv_heads": 2})


def test_attention_implementations_remat_and_bf16_agree():
    cfg = ModelShape(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, n_kv_heads=2)
    params = init_params(cfg, jax.random.key(0), seq_len=12)
    batch = jax.random.randint(jax.random.key(1), (3, 13), 0, 50)
    def loss_and_grads(c):
        return jax.jit(jax.value_and_grad(lambda p: next_token_loss(p, c, batch)))(params)

    base, base_grads = loss_and_grads(cfg)
    for variant in (replace(cfg, attention="xla"), replace(cfg, remat=True)):
        loss, grads = loss_and_grads(variant)
        assert abs(float(loss) - float(base)) < 1e-5, variant
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    bf16 = replace(cfg, compute_dtype="bfloat16")
    logits = jax.jit(Transformer(bf16).apply)({"params": params}, batch[:, :-1])
    assert logits.dtype == jnp.bfloat16
    loss, metrics = jax.jit(lambda p: loss_and_metrics(p, bf16, batch))(params)
    assert loss.dtype == jnp.float32 and abs(float(loss) - float(base)) < 0.05
    assert float(metrics["moe_aux"]) == 0.0 and float(metrics["ce"]) == float(loss)


# --- MFU --------------------------------------------------------------------------------------


def test_mfu_on_known_numbers():
    cfg = ModelConfig(preset="1b").shape(32_000)  # TinyLlama shape
    d, L, f, kv, v, T = 2048, 22, 5632, 256, 32_000, 2048
    n_matmul = L * (2 * d * d + 2 * d * kv + 3 * d * f) + d * v
    assert n_matmul == 22 * 44_040_192 + 65_536_000 == 1_034_420_224
    per_token = 6 * n_matmul + 12 * L * d * T
    assert flops_per_token(cfg, T) == per_token
    # 60,000 tokens/s on one H200 SXM (989.5 TFLOP/s dense bf16)
    assert mfu(60_000, cfg, T, 989.5e12) == pytest.approx(60_000 * per_token / 989.5e12)
    assert 0.44 < mfu(60_000, cfg, T, 989.5e12) < 0.45
    with pytest.raises(ValueError, match="positive"):
        mfu(1.0, cfg, T, 0.0)


@pytest.mark.parametrize("kind, key", [
    ("NVIDIA H200", "h200-sxm"), ("NVIDIA H200 NVL", "h200-nvl"), ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA L4", "l4"),
    ("TPU v4", "tpu-v4"), ("TPU v5 lite", "tpu-v5e"), ("TPU v5e", "tpu-v5e"), ("TPU v5", "tpu-v5p"),
    ("TPU v5p", "tpu-v5p"), ("TPU v6 lite", "tpu-v6e"),
])
def test_peak_flops_lookup(kind, key):
    assert peak_flops_per_s(kind) == PEAK_BF16_FLOPS[key]


def test_peak_flops_unknown_kind():
    with pytest.raises(UnknownDeviceKind, match="known:"):
        peak_flops_per_s("cpu")
