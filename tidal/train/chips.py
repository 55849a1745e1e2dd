"""The accelerator constants a sizing needs, one row per chip, each with the page that states it.

Invariant: the sizer (:mod:`tidal.train.sizing`) never branches on a chip's name; it reads a row.
Peak bf16 FLOP/s is :data:`tidal.train.flops.PEAK_BF16_FLOPS` (the MFU the trainer reports uses the
same figure) and HBM capacity is :mod:`tidal.launch.resources`' (the figure pods are planned with); the
bandwidths and ``hbm_bytes`` of chips GKE's tables do not list (v4) are here.

Sources (read 2026-12; copied from each page's specification table):

* v4: Cloud TPU "TPU v4" (https://cloud.google.com/tpu/docs/v4): 275 TFLOP/s bf16, 32 GiB HBM2 at
  1,200 GB/s, ICI 2,400 Gbps per chip.
* v5e: https://cloud.google.com/tpu/docs/v5e: 197 TFLOP/s, 16 GB at 819 GB/s, ICI 1,600 Gbps.
* v5p: https://cloud.google.com/tpu/docs/v5p: 459 TFLOP/s, 95 GB at 2,765 GB/s, ICI 4,800 Gbps.
* v6e: https://cloud.google.com/tpu/docs/v6e: 918 TFLOP/s, 32 GB at 1,640 GB/s, ICI 3,584 Gbps.
* H100 SXM and H200 SXM: NVIDIA's datasheets (https://www.nvidia.com/en-us/data-center/h100/,
  https://www.nvidia.com/en-us/data-center/h200/): 989.5 TFLOP/s dense bf16; 80 GB HBM3 at 3.35 TB/s
  and 141 GB HBM3e at 4.8 TB/s; NVLink 900 GB/s per GPU (both directions, so 450 GB/s each way).
* A100 SXM (https://www.nvidia.com/en-us/data-center/a100/): 312 TFLOP/s; 40 GB at 1,555 GB/s, 80 GB at
  2,039 GB/s; NVLink 600 GB/s (300 each way). L4 (https://www.nvidia.com/en-us/data-center/l4/): 121
  TFLOP/s, 24 GB at 300 GB/s, no NVLink: PCIe Gen4 x16, 64 GB/s (32 each way).

ICI is the TPU pages' "inter-chip interconnect bandwidth" per chip in bits per second, turned into bytes
(/ 8); the GPUs' link figure is one direction. A collective's time is its bytes on the wire per chip over
that rate (:mod:`tidal.train.sizing`): one figure per chip, whatever the collective's axis, so a prediction
errs either way; across TPU slices (DCN, far slower) nothing is modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.launch.resources import GPU_TYPES, TPU_TYPES
from tidal.train.flops import PEAK_BF16_FLOPS

GIB = 2**30


class UnknownChip(ValueError):
    """No row describes this accelerator; the message lists the known chips."""


@dataclass(frozen=True)
class Chip:
    """One accelerator chip's constants.

    Attributes:
        name: short name (``v5e``, ``h100``).
        platform: ``tpu`` or ``gpu``.
        hbm_bytes: memory of one chip, bytes.
        peak_bf16_flops: dense bf16 FLOP/s of one chip.
        hbm_bytes_per_s: memory bandwidth of one chip, bytes/s.
        ici_bytes_per_s: chip-to-chip bandwidth of one chip (ICI on TPU, NVLink on GPU), bytes/s.
        source: the page(s) the figures come from.
    """

    name: str
    platform: str
    hbm_bytes: int
    peak_bf16_flops: float
    hbm_bytes_per_s: float
    ici_bytes_per_s: float
    source: str


def _tpu(name: str, hbm_gib: int | None, hbm_gbps: float, ici_gbit: float, source: str) -> Chip:
    key = next((k for k, t in TPU_TYPES.items() if t.name == name), None)
    hbm = TPU_TYPES[key].hbm_gib_per_chip if key else hbm_gib
    return Chip(name, "tpu", int(hbm * GIB), PEAK_BF16_FLOPS[f"tpu-{name}"], hbm_gbps * 1e9, ici_gbit * 1e9 / 8,
                source)


def _gpu(name: str, gke: str, peak: str, hbm_tbps: float, link_gbps: float, source: str) -> Chip:
    return Chip(name, "gpu", GPU_TYPES[gke].memory_gb * 10**9, PEAK_BF16_FLOPS[peak], hbm_tbps * 1e12,
                link_gbps * 1e9, source)


CHIPS: dict[str, Chip] = {chip.name: chip for chip in (
    _tpu("v4", 32, 1200, 2400, "https://cloud.google.com/tpu/docs/v4"),
    _tpu("v5e", None, 819, 1600, "https://cloud.google.com/tpu/docs/v5e"),
    _tpu("v5p", None, 2765, 4800, "https://cloud.google.com/tpu/docs/v5p"),
    _tpu("v6e", None, 1640, 3584, "https://cloud.google.com/tpu/docs/v6e"),
    _gpu("h100", "nvidia-h100-80gb", "h100-sxm", 3.35, 450, "https://www.nvidia.com/en-us/data-center/h100/"),
    _gpu("h200", "nvidia-h200-141gb", "h200-sxm", 4.8, 450, "https://www.nvidia.com/en-us/data-center/h200/"),
    _gpu("a100", "nvidia-tesla-a100", "a100", 1.555, 300, "https://www.nvidia.com/en-us/data-center/a100/"),
    _gpu("a100-80gb", "nvidia-a100-80gb", "a100", 2.039, 300, "https://www.nvidia.com/en-us/data-center/a100/"),
    _gpu("l4", "nvidia-l4", "l4", 0.3, 32, "https://www.nvidia.com/en-us/data-center/l4/"),
)}
# GKE accelerator names (tidal/launch/resources.py) -> chip
GKE_CHIPS = {**{key: t.name for key, t in TPU_TYPES.items()},
             "nvidia-h100-80gb": "h100", "nvidia-h100-mega-80gb": "h100", "nvidia-h200-141gb": "h200",
             "nvidia-tesla-a100": "a100", "nvidia-a100-80gb": "a100-80gb", "nvidia-l4": "l4"}


def chip(name: str) -> Chip:
    """The chip of a short name (``v5e``) or a GKE accelerator name (``tpu-v5-lite-podslice``).

    Raises:
        UnknownChip: no row; names the known chips.
    """
    key = GKE_CHIPS.get(name, name)
    if key not in CHIPS:
        raise UnknownChip(f"no sizing constants for accelerator {name!r}; known: {sorted(CHIPS)} "
                          f"(and the GKE names {sorted(GKE_CHIPS)}; tidal/train/chips.py)")
    return CHIPS[key]
