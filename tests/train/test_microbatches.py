"""Gradient accumulation (issue 40, item 3): ``train.microbatches`` splits each step's batch into parts whose
gradients a scan accumulates before the one update. The update is the whole batch's within float32
rounding, the option stays out of step ids when unused, and a split that would move rows between devices
or leave a remainder is refused."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tidal.train.build import accumulated_value_and_grad, train_functions
from tidal.train.config import ConfigError, parse_step_config
from tidal.train.model import next_token_loss

BASE = {"model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256}, "steps": 10, "batch_size": 8,
        "optimizer": {"warmup_steps": 2}, "train_data": "mix", "tokenizer": "tokenizer"}
VOCAB, CONTEXT = 512, 31


def _gradients(microbatches: int, batch: np.ndarray):
    cfg = parse_step_config({**BASE, "microbatches": microbatches})
    shape = cfg.model.shape(VOCAB)
    params = jax.jit(train_functions(cfg, shape, CONTEXT)[0])(jax.random.key(3))["params"]

    def loss(p, b):
        return next_token_loss(p, shape, b), {}

    return jax.jit(accumulated_value_and_grad(jax.value_and_grad(loss, has_aux=True), microbatches))(params, batch)


def _step_stats(microbatches: int, batch: np.ndarray) -> dict:
    cfg = parse_step_config({**BASE, "microbatches": microbatches})
    init, step_fn, _, _ = train_functions(cfg, cfg.model.shape(VOCAB), CONTEXT)
    return jax.jit(step_fn)(jax.jit(init)(jax.random.key(3)), batch, 0)[1]


def test_the_accumulated_gradient_is_the_whole_batch_gradient_within_float32_rounding():
    batch = np.random.default_rng(7).integers(0, VOCAB, size=(8, CONTEXT + 1), dtype=np.int32)
    (loss, _), grads = _gradients(1, batch)
    stats = _step_stats(1, batch)
    for microbatches in (2, 8):
        (part_loss, _), part_grads = _gradients(microbatches, batch)
        assert float(part_loss) == pytest.approx(float(loss), rel=1e-6)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(part_grads), strict=True):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * float(np.abs(a).max()))
        # and the step the trainer jits reports the same loss and gradient norm
        part_stats = _step_stats(microbatches, batch)
        assert float(part_stats["loss"]) == pytest.approx(float(stats["loss"]), rel=1e-6)
        assert float(part_stats["grad_norm"]) == pytest.approx(float(stats["grad_norm"]), rel=1e-5)
    assert float(stats["grad_norm"]) > 0


def test_unused_microbatches_change_no_step_config_and_a_remainder_is_refused():
    assert "microbatches" not in parse_step_config(BASE).model_dump(mode="json")
    assert parse_step_config({**BASE, "microbatches": 4}).model_dump(mode="json")["microbatches"] == 4
    with pytest.raises(ConfigError, match=r"microbatches \(3\) must divide batch_size \(8\)"):
        parse_step_config({**BASE, "microbatches": 3})
