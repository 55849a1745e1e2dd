"""Train config parsing (one schema with the recipe's), the step seed and the learning-rate schedule."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from tidal.train.config import ConfigError, TrainStepConfig, parse_step_config
from tidal.train.optimizer import make_optimizer

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
    cfg = parse_step_config(BASE)
    assert cfg.steps == 100 and cfg.optimizer.lr == 1e-3 and cfg.eval_data == {"udhr": "tokenize-udhr"}
    assert cfg.model.kv_heads == 2 and cfg.model.shape(64).vocab_size == 64


@pytest.mark.parametrize("path, value, message", [
    ("steps", 0, "steps: Input should be greater than 0 \\(got 0\\)"),
    ("batch_size", 2.5, "batch_size: Input should be a valid integer \\(got 2.5\\)"),
    ("checkpoint_evry", 5, "checkpoint_evry: unknown field"),
    ("train_data", KeyError, "train_data: Field required"),
    ("optimizer.b2", 1.5, "optimizer.b2: Input should be less than 1"),
    ("optimizer.warmup_steps", 100, "optimizer.warmup_steps \\(100\\) must be below steps \\(100\\)"),
    ("eval_data", ["udhr"], "eval_data: Input should be a valid dictionary"),
    ("mesh", {"pipeline": 2}, "mesh.pipeline: unknown field"),
    ("mesh", {"fsdp": -1}, "mesh.fsdp: Input should be greater than 0"),
    ("checkpoint_permanent_every", 0, "checkpoint_permanent_every: Input should be greater than 0"),
    ("model.n_heads", 3, "model: d_model \\(32\\) must be divisible by n_heads \\(3\\)"),
    ("model.moe", {"n_experts": 2, "every": 3}, "model: moe.every \\(3\\) exceeds n_layers \\(2\\)"),
])
def test_config_errors_name_the_dotted_field(path, value, message):
    with pytest.raises(ConfigError, match="^steps/spec.json: train config: .*" + message):
        parse_step_config(with_change(path, value), "steps/spec.json")


def test_step_config_is_the_recipe_schema_plus_input_names():
    from tidal.recipe import TrainConfig, TrainSection

    assert TrainSection.__mro__[1] is TrainConfig and TrainStepConfig.__mro__[1] is TrainConfig
    own = set(TrainStepConfig.model_fields) - set(TrainConfig.model_fields)
    assert own == {"seed", "train_data", "eval_data", "heldout_data", "tokenizer"}
    # resources: not hashed; decay_branches: train steps of their own (the trunk's config never holds them)
    assert set(TrainSection.model_fields) - set(TrainConfig.model_fields) == {"resources", "decay_branches"}


def test_a_spec_without_a_seed_is_refused_naming_the_file_and_field():
    from tidal.train.build import build, step_seed

    assert step_seed({"seed": 2**62 + 1}) == 2**62 + 1
    with pytest.raises(ConfigError, match=r"^run/spec.json: missing field 'seed' .*does not default it"):
        build({"config": parse_step_config(BASE), "inputs": {}}, where="run/spec.json")
    for bad in (-1, True, "7", 1.0):
        with pytest.raises(ConfigError, match=rf"x.json: field 'seed' must be a non-negative int, got {bad!r}"):
            step_seed({"seed": bad}, "x.json")


def test_load_spec_then_train_names_spec_json_when_the_seed_is_missing(tmp_path):
    import json
    import re

    from tidal.train.trainer import load_spec, train

    (tmp_path / "spec.json").write_text(json.dumps({"config": BASE, "inputs": {}}))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 'spec.json'))}: missing field 'seed'"):
        train(tmp_path, load_spec(tmp_path))


def test_schedule_warmup_then_cosine_to_min():
    cfg = parse_step_config(BASE)
    _, schedule = make_optimizer(cfg.optimizer, cfg.steps)
    assert float(schedule(0)) == 0.0
    np.testing.assert_allclose(float(schedule(10)), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(float(schedule(55)), 1e-4 + 0.5 * (1e-3 - 1e-4), rtol=1e-5)
    np.testing.assert_allclose(float(schedule(100)), 1e-4, rtol=1e-6)


def test_optional_mesh_and_permanent_checkpoints():
    cfg = parse_step_config(BASE | {"mesh": {"data": None, "fsdp": 2, "tensor": 1},
                                    "checkpoint_permanent_every": 50})
    assert cfg.mesh.model_dump() == {"data": None, "fsdp": 2, "tensor": 1} and cfg.checkpoint_permanent_every == 50
    assert parse_step_config(BASE).mesh is None


def test_recipe_leaves_unset_trainer_options_out_of_the_step_config(tiny_data):
    from tidal.core.planner import build_graph
    from tidal.recipe import parse_recipe

    config = build_graph(parse_recipe(tiny_data))["train"].config
    assert "mesh" not in config and "checkpoint_permanent_every" not in config  # step ids unchanged
    tiny_data["train"] |= {"mesh": {"fsdp": 4}, "checkpoint_permanent_every": 100}
    config = build_graph(parse_recipe(tiny_data))["train"].config
    assert config["mesh"] == {"data": None, "fsdp": 4, "tensor": None}
    assert parse_step_config(config).checkpoint_permanent_every == 100
    assert TrainStepConfig.model_validate(config).model_dump() == config  # the trainer reads back what was hashed
