"""Model presets: parameter counts (against the table in the presets docstring), resolution, recipes."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import pytest
import yaml

from tidal.recipe import RecipeError, parse_recipe
from tidal.train import presets
from tidal.train.flops import ModelConfig, param_count

V = 32_000  # the vocabulary the docstring's counts assume (Llama / TinyLlama)
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
# stated ranges of total parameters at V = 32k (names are nominal sizes, untied embeddings counted)
RANGES = {"tiny": (1e6, 1e7), "small": (1e7, 3e7), "125m": (1.1e8, 1.5e8), "350m": (3.0e8, 4.0e8),
          "760m": (7.0e8, 8.5e8), "1b": (1.0e9, 1.2e9), "8b": (7.0e9, 8.1e9)}


def _table() -> dict[str, tuple[int, ...]]:
    rows = re.findall(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d,]+)\s+([\d,]+)$",
                      presets.__doc__, flags=re.MULTILINE)
    return {r[0]: tuple(int(x.replace(",", "")) for x in r[1:]) for r in rows}


def test_docstring_table_is_what_param_count_says():
    table = _table()
    assert list(table) == list(presets.PRESETS) == list(RANGES)
    for name, (d, layers, heads, kv, d_ff, total, non_embedding) in table.items():
        cfg = ModelConfig(preset=name).shape(V)
        assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.d_ff) == (d, layers, heads, kv, d_ff)
        assert param_count(cfg) == total and total - 2 * V * d == non_embedding
        low, high = RANGES[name]
        assert low <= total <= high, name


@pytest.mark.parametrize("name", ["125m", "1b"])
def test_initialised_shapes_match_param_count(name):
    from tidal.train.model import init_params

    cfg = ModelConfig(preset=name).shape(V)
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0), seq_len=8))  # no memory used
    assert sum(x.size for x in jax.tree.leaves(shapes)) == param_count(cfg)


def test_written_fields_override_the_preset_and_unknown_names_list_the_valid_ones():
    cfg = ModelConfig.model_validate({"preset": "1b", "n_layers": 2, "n_kv_heads": 8}).shape(V)
    assert (cfg.d_model, cfg.n_layers, cfg.n_kv_heads, cfg.d_ff) == (2048, 2, 8, 5632)
    valid = "tiny, small, 125m, 350m, 760m, 1b"
    with pytest.raises(ValueError, match=rf"unknown model preset '2b'; valid presets: {valid}"):
        ModelConfig.model_validate({"preset": "2b"})


def _recipe(model: dict) -> dict:
    data = yaml.safe_load(RECIPE.read_text())
    data["train"]["model"] = model
    return data


def test_recipe_resolves_presets_and_keeps_existing_step_configs():
    recipe = parse_recipe(_recipe({"preset": "125m", "n_layers": 2}))
    dumped = recipe.train.model_dump(exclude={"resources"})["model"]
    assert dumped == {"d_model": 768, "n_layers": 2, "n_heads": 12, "d_ff": 2048}  # resolved, no preset name
    assert recipe.train.model.preset == "125m"
    # a recipe without the new fields dumps exactly the four original keys (its step ids do not move)
    plain = parse_recipe(_recipe({"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512}))
    assert plain.train.model_dump()["model"] == {"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512}
    same = parse_recipe(_recipe({"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512, "n_kv_heads": 4,
                                 "compute_dtype": "float32"}))
    assert same.train.model_dump() == plain.train.model_dump()
    gqa = parse_recipe(_recipe({"preset": "tiny", "n_kv_heads": 2, "moe": {"n_experts": 4}}))
    model = gqa.train.model_dump()["model"]
    assert model["n_kv_heads"] == 2 and model["moe"]["n_experts"] == 4 and model["moe"]["top_k"] == 2
    assert ModelConfig.model_validate(model).moe.capacity_factor == 1.25  # the trainer reads it back


@pytest.mark.parametrize("model, message", [
    ({"preset": "2b"}, "train.model: unknown model preset '2b'; valid presets: tiny"),
    ({"preset": "tiny", "n_kv_heads": 3}, "must divide n_heads"),
    ({"preset": "tiny", "moe": {"n_experts": 2, "top_k": 4}}, "train.model.moe: .*must not exceed"),
])
def test_recipe_refuses_bad_model_fields(model, message):
    with pytest.raises(RecipeError, match=message):
        parse_recipe(_recipe(model), "recipes/x.yaml")
