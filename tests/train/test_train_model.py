"""Model: parameter count formula, FLOPs formula, causality, config checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tidal.train.model import (
    ModelConfig,
    Transformer,
    flops_per_token,
    init_params,
    next_token_loss,
    param_count,
)

CFG = ModelConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=4, d_ff=40)


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
    ({"d_model": 16, "n_layers": 2, "n_heads": 16, "d_ff": 8}, "even head dim"),
    ({"d_model": 16, "n_layers": 0, "n_heads": 2, "d_ff": 8}, "model.n_layers"),
    ({"d_model": 16, "n_layers": 2, "n_heads": 2}, "missing keys ['d_ff']"),
])
def test_model_config_errors(model, rule):
    with pytest.raises(ValueError, match=rule.replace("[", r"\[").replace("]", r"\]")):
        ModelConfig.from_config(model, vocab_size=50)
