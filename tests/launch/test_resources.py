"""The hardware tables: internal consistency, the GKE names, and refusals that list valid values."""

from __future__ import annotations

import pytest

from tidal.launch.resources import (
    GPU_TYPES,
    TPU_TYPES,
    UnknownAccelerator,
    gpu_type,
    tpu_slice,
    tpu_type,
)
from tidal.recipe import RecipeError, parse_recipe


def test_tpu_rows_are_consistent():
    for tpu in TPU_TYPES.values():
        assert tpu.source.startswith("https://")
        for name, topo in tpu.topologies.items():
            assert name == topo.topology and topo.source.startswith("https://")
            assert topo.chips == topo.hosts * topo.chips_per_host
            assert topo.chips_per_host in (1, 4, 8)
            assert topo.multi_host == (topo.hosts > 1)
            assert topo.machine_type.endswith(f"-{topo.chips_per_host}t")


def test_known_shapes_from_gke_docs():
    assert set(TPU_TYPES) == {"tpu-v5-lite-podslice", "tpu-v5p-slice", "tpu-v6e-slice"}
    _, v5e = tpu_slice("v5e", "2x4")
    assert (v5e.chips, v5e.hosts, v5e.machine_type) == (8, 1, "ct5lp-hightpu-8t")
    _, v6e = tpu_slice("tpu-v6e-slice", "4x4")
    assert (v6e.chips, v6e.hosts, v6e.chips_per_host) == (16, 4, 4)
    _, v5p = tpu_slice("v5p", "2x2x2")
    assert (v5p.chips, v5p.hosts, v5p.chips_per_host) == (8, 2, 4)
    assert set(GPU_TYPES) == {"nvidia-l4", "nvidia-tesla-a100", "nvidia-a100-80gb", "nvidia-h100-80gb",
                              "nvidia-h100-mega-80gb", "nvidia-h200-141gb"}
    assert gpu_type("nvidia-h100-80gb", 8).counts[8] == "a3-highgpu-8g"


def test_unknown_hardware_is_refused_with_the_valid_values():
    with pytest.raises(UnknownAccelerator, match=r"valid: \['tpu-v5-lite-podslice'"):
        tpu_type("tpu-v4-podslice")
    with pytest.raises(UnknownAccelerator, match=r"valid: \['1x1', '2x2', '2x4'"):
        tpu_slice("v6e", "3x3")
    with pytest.raises(UnknownAccelerator, match="nvidia-h200-141gb"):
        gpu_type("nvidia-h200", 8)
    with pytest.raises(UnknownAccelerator, match=r"\[8\] GPUs per node, not 4"):
        gpu_type("nvidia-h100-mega-80gb", 4)


def test_recipe_refuses_unknown_topology_with_field_path(tiny_data):
    tiny_data["train"]["resources"] = {"launcher": "gke", "accelerator": {"kind": "tpu", "type": "v5p",
                                                                         "topology": "2x2x3"}}
    with pytest.raises(RecipeError, match=r"train\.resources\.accelerator: .*valid: \['2x2x1'"):
        parse_recipe(tiny_data, "tiny.yaml")


def test_recipe_refuses_multislice_of_single_host_slices(tiny_data):
    tiny_data["train"]["resources"] = {"accelerator": {"kind": "tpu", "type": "v5e", "topology": "2x4", "slices": 2}}
    with pytest.raises(RecipeError, match="multislice needs multi-host"):
        parse_recipe(tiny_data, "tiny.yaml")
