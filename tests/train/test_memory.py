"""Memory planner: its terms against a hand computation, and refusals that name the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tidal.recipe import RecipeError, parse_recipe
from tidal.train.flops import ModelConfig, ModelShape, param_count
from tidal.train.memory import (
    GIB,
    MemoryPlanError,
    MeshShape,
    check_fits,
    default_mesh,
    plan_memory,
    quantity_bytes,
)

# d 32, L 2, 4 query heads of 8, 2 key/value heads (kv width 16), d_ff 64, V 100
CFG = ModelShape(vocab_size=100, d_model=32, n_layers=2, n_heads=4, d_ff=64, n_kv_heads=2)
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def test_terms_match_a_hand_computation():
    n = 2 * 100 * 32 + 2 * (2 * 32 * 32 + 2 * 32 * 16 + 2 * 32) + 2 * 3 * 32 * 64 + 32
    assert param_count(CFG) == n == 24_992
    plan = plan_memory(CFG, batch_size=8, seq_len=16, mesh=MeshShape(data=2, fsdp=2), capacity_bytes=10**6)
    assert plan.params_bytes == plan.grads_bytes == 24_992 * 4 // 2  # float32, sharded over fsdp=2
    assert plan.optimizer_bytes == 24_992 * 8 // 2  # AdamW mu + nu, float32
    tokens = (8 // 4) * 16  # 2 sequences per device (data*fsdp = 4)
    per_token_layer = 4 * 32 + 2 * 32 + 2 * 16 + 4 * 64 + 4 * 16  # norms, q+o, k+v, SwiGLU, softmax H*T
    assert plan.activation_bytes == 2 * tokens * per_token_layer * 4 + tokens * 100 * (4 + 8) == 177_664
    assert plan.total_bytes == 49_984 * 2 + 99_968 + 177_664 and plan.fits

    remat = plan_memory(CFG, batch_size=8, seq_len=16, mesh=MeshShape(data=2, fsdp=2), capacity_bytes=10**6,
                        remat=True)
    assert remat.activation_bytes == 2 * tokens * 32 * 4 + tokens * per_token_layer * 4 + tokens * 100 * 12

    bf16 = plan_memory(CFG, batch_size=8, seq_len=16, mesh=MeshShape(fsdp=2, tensor=2), capacity_bytes=10**6,
                       compute_dtype="bfloat16", flash=True)
    tokens = 4 * 16
    split = (2 * 32 + 2 * 16 + 4 * 64) / 2  # tensor-parallel part, no softmax probabilities (flash)
    assert bf16.params_bytes == 24_992 * 4 // 4
    assert bf16.activation_bytes == 2 * tokens * (4 * 32 + split) * 2 + tokens * 100 // 2 * (2 + 8)


def test_moe_terms_match_a_hand_computation():
    moe = ModelConfig.model_validate({"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64,
                                      "moe": {"n_experts": 4, "top_k": 2, "capacity_factor": 1.0, "every": 2}})
    moe = moe.shape(100)
    plan = plan_memory(moe, batch_size=2, seq_len=16, mesh=MeshShape(), capacity_bytes=10**7)
    n = 2 * 100 * 32 + 2 * (2 * 32 * 32 + 2 * 32 * 16 + 2 * 32) + 3 * 32 * 64 + (4 * 3 * 32 * 64 + 32 * 4) + 32
    assert plan.params_bytes == 4 * n and plan.optimizer_bytes == 8 * n
    tokens, capacity = 2 * 16, 8  # C = ceil(1.0 * 16 * 2 / 4)
    dense = 4 * 32 + 2 * 32 + 2 * 16 + 4 * 64 + 4 * 16
    expert = 4 * 32 + 2 * 32 + 2 * 16 + 1.0 * 2 * (2 * 32 + 4 * 64) + 4 * 16
    routing_bytes = (2 + 2) * 4 * capacity * 4
    assert plan.activation_bytes == tokens * (dense * 4 + expert * 4 + routing_bytes) + tokens * 100 * 12


def test_refusal_names_every_term_and_the_capacity():
    with pytest.raises(MemoryPlanError) as err:
        check_fits(CFG, batch_size=8, seq_len=16, mesh=MeshShape(), capacity_bytes=100_000, device="toy 100 kB")
    text = str(err.value)
    for term in ("params", "grads", "optimizer (AdamW)", "activations", "per device", "toy 100 kB", "usable 90%"):
        assert term in text
    assert check_fits(CFG, batch_size=8, seq_len=16, mesh=MeshShape(), capacity_bytes=10**7).fits


def _recipe(model: dict, accelerator: dict, batch_size: int = 16, launcher: str = "gke") -> dict:
    data = yaml.safe_load(RECIPE.read_text())
    data["train"].update(model=model, batch_size=batch_size,
                         resources={"launcher": launcher, "accelerator": accelerator})
    data["tokenize"]["seq_len"] = 2049
    data["tokenizer"]["vocab_size"] = 32_000
    return data


def test_1b_preset_on_one_v5e_chip_is_refused_at_validation_with_the_numbers():
    v5e = {"kind": "tpu", "type": "tpu-v5-lite-podslice", "topology": "1x1"}
    with pytest.raises(RecipeError) as err:
        parse_recipe(_recipe({"preset": "1b"}, v5e), "recipes/big.yaml")
    text = str(err.value)
    assert text.startswith("recipes/big.yaml") and "tokenize.seq_len 2049" in text
    n = param_count(ModelConfig(preset="1b").shape(32_000))
    assert f"params {n * 4 / GIB:.2f} GiB" in text and f"optimizer (AdamW) {n * 8 / GIB:.2f} GiB" in text
    assert "16.00 GiB" in text and "fsdp=1" in text
    # 64 chips (fsdp 64) shard the state and the batch, but float32 attention probabilities of
    # 2048 tokens (32 heads x 2048 x 2048 x 4 bytes per layer and sequence) still do not fit ...
    with pytest.raises(RecipeError, match=r"activations 17\.\d\d GiB \(1 seq x 2048 tokens"):
        parse_recipe(_recipe({"preset": "1b"}, v5e | {"topology": "8x8"}, batch_size=64))
    # ... in bfloat16 they do
    bf16 = _recipe({"preset": "1b", "compute_dtype": "bfloat16"}, v5e | {"topology": "8x8"}, batch_size=64)
    parse_recipe(bf16)
    # unless train.mesh replicates the parameters (pure data parallelism over the 64 chips)
    with pytest.raises(RecipeError, match=r"optimizer \(AdamW\) 8\.\d\d GiB .* mesh data=64 fsdp=1"):
        parse_recipe(bf16 | {"train": bf16["train"] | {"mesh": {"data": 64}}})
    with pytest.raises(RecipeError, match="nvidia-l4 24 GB"):
        parse_recipe(_recipe({"preset": "1b"}, {"kind": "gpu", "type": "nvidia-l4", "count": 1}))
    parse_recipe(_recipe({"preset": "tiny"}, {"kind": "gpu", "type": "nvidia-l4", "count": 1}))
    # a local CPU run is not checked (the machine is not known at planning time)
    parse_recipe(_recipe({"preset": "1b"}, {"kind": "cpu"}, launcher="local"))
    with pytest.raises(RecipeError, match="cpu pod memory 8Gi"):
        parse_recipe(_recipe({"preset": "1b"}, {"kind": "cpu"}))


@pytest.mark.parametrize("n, slices, requested", [(8, 1, None), (16, 2, None), (8, 1, {"tensor": 2}),
                                                  (8, 1, {"data": 2, "fsdp": None}), (4, 1, {"fsdp": 2})])
def test_default_mesh_is_the_trainers_mesh(n, slices, requested):
    from tidal.train.mesh import mesh_shape

    assert default_mesh(n, slices, requested) == MeshShape(**mesh_shape(n, requested, slices))


def test_quantities():
    assert quantity_bytes("8Gi") == 8 * 2**30 and quantity_bytes("16G") == 16 * 10**9
    assert quantity_bytes("512Mi") == 2**29
    with pytest.raises(ValueError, match="memory quantity"):
        quantity_bytes("lots")
