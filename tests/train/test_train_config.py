"""Train config parsing and the learning-rate schedule."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from tidal.train.config import ConfigError, TrainConfig, make_optimizer

BASE = {
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64},
    "optimizer": {"lr": 1e-3, "min_lr_ratio": 0.1, "warmup_steps": 10, "weight_decay": 0.1,
                  "b1": 0.9, "b2": 0.95, "grad_clip": 1.0},
    "steps": 100, "batch_size": 8, "checkpoint_every": 50, "eval_every": 50, "eval_batches": 2,
    "log_every": 10, "keep_checkpoints": 2, "train_data": "mix", "eval_data": {"udhr": "tokenize-udhr"},
    "tokenizer": "tokenizer",
}


def with_change(path: str, value):
    cfg = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = cfg
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[leaf]
    else:
        node[leaf] = value
    return cfg


def test_parses_base():
    cfg = TrainConfig.from_config(BASE)
    assert cfg.steps == 100 and cfg.optimizer.lr == 1e-3 and cfg.eval_data == {"udhr": "tokenize-udhr"}


@pytest.mark.parametrize("path, value, message", [
    ("steps", 0, "'steps' must be a positive int"),
    ("batch_size", 2.5, "'batch_size' must be a positive int"),
    ("checkpoint_evry", 5, "unknown keys \\['checkpoint_evry'\\]"),
    ("log_every", KeyError, "missing keys \\['log_every'\\]"),
    ("optimizer.b2", 1.5, "'optimizer.b2' must be a number in \\[0.0, 1.0\\]"),
    ("optimizer.warmup_steps", 100, "warmup_steps' \\(100\\) must be below 'steps'"),
    ("eval_data", ["udhr"], "'eval_data' must map source"),
    ("mesh", {"pipeline": 2}, "'mesh': unknown axes \\['pipeline'\\]"),
    ("mesh", {"fsdp": -1}, "'mesh.fsdp' must be a positive int or null"),
    ("checkpoint_permanent_every", 0, "'checkpoint_permanent_every' must be a positive int"),
])
def test_config_errors_name_the_key(path, value, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig.from_config(with_change(path, value))


def test_schedule_warmup_then_cosine_to_min():
    cfg = TrainConfig.from_config(BASE)
    _, schedule = make_optimizer(cfg.optimizer, cfg.steps)
    assert float(schedule(0)) == 0.0
    np.testing.assert_allclose(float(schedule(10)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(55)), 1e-4 + 0.5 * (1e-3 - 1e-4), rtol=1e-5)
    np.testing.assert_allclose(float(schedule(100)), 1e-4, rtol=1e-6)


def test_optional_mesh_and_permanent_checkpoints():
    cfg = TrainConfig.from_config(BASE | {"mesh": {"data": None, "fsdp": 2, "tensor": 1},
                                          "checkpoint_permanent_every": 50})
    assert cfg.mesh == {"data": None, "fsdp": 2, "tensor": 1} and cfg.checkpoint_permanent_every == 50
    assert TrainConfig.from_config(BASE).mesh is None


def test_recipe_leaves_unset_trainer_options_out_of_the_step_config(tiny_data):
    from tidal.core.planner import build_graph
    from tidal.recipe import parse_recipe

    config = build_graph(parse_recipe(tiny_data))["train"].config
    assert "mesh" not in config and "checkpoint_permanent_every" not in config  # step ids unchanged
    tiny_data["train"] |= {"mesh": {"fsdp": 4}, "checkpoint_permanent_every": 100}
    config = build_graph(parse_recipe(tiny_data))["train"].config
    assert config["mesh"] == {"data": None, "fsdp": 4, "tensor": None}
    assert TrainConfig.from_config(config).checkpoint_permanent_every == 100
