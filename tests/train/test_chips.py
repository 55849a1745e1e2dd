"""Every accelerator a recipe may name has sizing constants (tidal/train/chips.py), taken from the same tables
the pods are planned with (tidal/launch/resources.py) and the MFU is computed with (tidal/train/flops.py)."""

from __future__ import annotations

import pytest

from tidal.launch.resources import GPU_TYPES, TPU_TYPES
from tidal.train.chips import UnknownChip, chip
from tidal.train.flops import PEAK_BF16_FLOPS


def test_every_accelerator_the_launch_tables_accept_has_sizing_constants():
    for name in [*TPU_TYPES, *GPU_TYPES]:
        row = chip(name)
        assert row.hbm_bytes > 0 and row.hbm_bytes_per_s > 0 and row.ici_bytes_per_s > 0, row
        assert row.peak_bf16_flops in PEAK_BF16_FLOPS.values(), row
    for key, tpu in TPU_TYPES.items():  # short and GKE names are the same row, its HBM the pods' figure
        assert chip(tpu.name) is chip(key) and chip(key).hbm_bytes == tpu.hbm_gib_per_chip * 2**30
    assert chip("nvidia-h100-80gb").hbm_bytes == GPU_TYPES["nvidia-h100-80gb"].memory_gb * 10**9
    with pytest.raises(UnknownChip, match="known: .*v5e"):
        chip("tpu-v9")
