"""Per-device memory plan of a training run, and the refusal of one that cannot fit.

Invariant: a recipe whose model, batch and sequence length cannot fit its accelerator is
refused when the recipe is validated (``tidal plan``, DAG parsing, ``prepare``), with every
term in GiB and the device's capacity, never after a pod has been scheduled and run out of
memory. Light on purpose: no JAX import (recipe validation calls :func:`check_recipe`).

Per device, for a mesh of ``data x fsdp x tensor`` devices (tidal/train/mesh.py: parameters
and optimizer moments are sharded over ``fsdp`` and, for the matmul kernels, ``tensor``; the
batch over ``data x fsdp``), with N = :func:`tidal.train.flops.param_count`, P the parameter
dtype's bytes (4: float32 master weights) and ``shards = fsdp * tensor``:

* parameters ``N * P / shards``; gradients the same (they have the parameters' dtype);
* optimizer state: AdamW's two moments ``mu`` and ``nu`` in float32, ``8 * N / shards``
  (optax ``adamw``; clipping keeps no state);
* activations kept for the backward pass, for ``b = ceil(B / (data * fsdp))`` sequences of
  ``T`` tokens, activation dtype of ``a`` bytes (4 float32, 2 bfloat16). Counted the way
  Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
  §4.1, eq. 1-2) count a GPT block (``sbh(34 + 5as/h)`` bytes), redone for this block (no
  dropout, RMSNorm, SwiGLU, GQA), per token and layer, in elements::

        4d                           inputs and outputs of the two RMSNorms (replicated)
      + (2d + 2kv + 4f + H*T) / t    q, k, v, attention output, gate, up, silu(gate) and its
                                     product (the W_down input), softmax probabilities
                                     (H*T per token; 0 with fused flash attention, which
                                     keeps only a per-row logsumexp)

  MoE layers replace ``4f`` by the expert buffers ``c*k*(2d + 4f)`` (``c`` the capacity
  factor) plus ``(2 + k)*E*C`` float32 routing one-hots per token (the per-choice slots, the
  dispatch and combine weights of tidal/train/moe.py; C slots per sequence).
  Activations total ``L * b*T * that * a`` bytes; with full recomputation (``remat``, Chen
  et al. 2016; Korthikanti §4.2 "full activation recomputation": ``2sbhL``) only each block's
  input ``L * b*T * d * a`` is kept plus one block's activations while it is recomputed.
  The output head adds ``b*T * V / t * (a + 8)`` bytes: the logits, their float32 log-softmax
  and its gradient.

The plan fits when the sum is at most ``usable_fraction`` (default 0.9) of the device's
memory: XLA's scratch buffers, fragmentation and the runtime are not modelled. On GPUs, JAX
preallocates 75 % of memory unless ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise; the
training image should set it (e.g. 0.95) for plans near the limit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tidal.launch.resources import gpu_type, tpu_slice
from tidal.train.flops import ModelShape, param_count

GIB = 2**30
GB = 10**9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAM_MOMENT_BYTES = 8  # mu and nu, float32
USABLE_FRACTION = 0.9


class MemoryPlanError(ValueError):
    """A run will not fit its devices; the message gives every term in GiB and the capacity."""


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the ``data``, ``fsdp`` and ``tensor`` mesh axes (tidal/train/mesh.py)."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    @property
    def devices(self) -> int:
        """Devices of the mesh: ``data * fsdp * tensor``."""
        return self.data * self.fsdp * self.tensor


@dataclass(frozen=True)
class MemoryPlan:
    """Estimated bytes per device of one training step (module docstring gives the formulas).

    Attributes:
        params_bytes, grads_bytes, optimizer_bytes, activation_bytes: the terms, bytes per device.
        capacity_bytes: memory of one device (bytes).
        usable_fraction: the share of ``capacity_bytes`` the plan may use.
        device: what the capacity belongs to, e.g. ``"tpu-v5-lite-podslice (v5e) 16 GiB"``.
        mesh: the mesh the plan assumes.
        sequences_per_device: b, sequences of the global batch on one device.
        seq_len: T, tokens per sequence (the model's input length).
        remat: activations recomputed in the backward pass.
    """

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    capacity_bytes: int
    usable_fraction: float
    device: str
    mesh: MeshShape
    sequences_per_device: int
    seq_len: int
    remat: bool

    @property
    def total_bytes(self) -> int:
        """Sum of the four terms, bytes per device."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        """True when ``total_bytes <= usable_fraction * capacity_bytes``."""
        return self.total_bytes <= self.usable_fraction * self.capacity_bytes

    def describe(self) -> str:
        """One line: each term and the capacity in GiB, the mesh and the batch per device."""
        gib = lambda n: f"{n / GIB:.2f} GiB"
        m = self.mesh
        return (f"params {gib(self.params_bytes)} + grads {gib(self.grads_bytes)} + optimizer (AdamW) "
                f"{gib(self.optimizer_bytes)} + activations {gib(self.activation_bytes)} "
                f"({self.sequences_per_device} seq x {self.seq_len} tokens per device, remat "
                f"{'on' if self.remat else 'off'}) = {gib(self.total_bytes)} per device; device {self.device}: "
                f"{gib(self.capacity_bytes)}, usable {self.usable_fraction:.0%} = "
                f"{gib(int(self.usable_fraction * self.capacity_bytes))}; mesh data={m.data} fsdp={m.fsdp} "
                f"tensor={m.tensor}")


def activation_elements_per_token_layer(cfg: ModelShape, layer: int, seq_len: int, tensor: int = 1,
                                        flash: bool = False) -> float:
    """Activation elements one token keeps for the backward pass in block ``layer``.

    ``4d + (2d + 2kv + FFN + H*T) / t`` with FFN = ``4f`` for a dense block and
    ``c*k*(2d + 4f)`` for an MoE block (its float32 dispatch/combine weights are bytes, added
    by :func:`plan_memory`). ``flash``: fused attention keeps no ``[H, T, T]`` probabilities.
    """
    d, f = cfg.d_model, cfg.d_ff
    attn_probs = 0 if flash else cfg.n_heads * seq_len
    if cfg.moe is not None and cfg.moe.is_moe_layer(layer):
        ffn = cfg.moe.capacity_factor * cfg.moe.top_k * (2 * d + 4 * f)
    else:
        ffn = 4 * f
    return 4 * d + (2 * d + 2 * cfg.kv_dim + ffn + attn_probs) / tensor


def plan_memory(cfg: ModelShape, *, batch_size: int, seq_len: int, mesh: MeshShape, capacity_bytes: int,
                device: str = "device", param_dtype: str = "float32", compute_dtype: str | None = None,
                remat: bool | None = None, flash: bool | None = None,
                usable_fraction: float = USABLE_FRACTION, microbatches: int = 1) -> MemoryPlan:
    """Estimate per-device bytes of one training step (formulas in the module docstring).

    Args:
        cfg: the model; ``cfg.compute_dtype``, ``cfg.remat`` and ``cfg.attention == "cudnn"``
            are the defaults of ``compute_dtype``, ``remat`` and ``flash``.
        batch_size: B, global sequences per step.
        seq_len: T, tokens per sequence fed to the model (the packed length minus one).
        mesh: data x fsdp x tensor sizes.
        capacity_bytes: memory of one device, bytes.
        device: label of the device for messages.
        param_dtype: dtype of parameters and gradients (``"float32"``).
        microbatches: the batch is computed in this many parts (``train.microbatches``): activations of
            ``b / microbatches`` sequences, and one more gradient-sized buffer (the accumulated sum).

    Returns:
        A :class:`MemoryPlan`.
    """
    compute_dtype = compute_dtype or cfg.compute_dtype
    remat = cfg.remat if remat is None else remat
    flash = cfg.attention == "cudnn" if flash is None else flash
    act, par = DTYPE_BYTES[compute_dtype], DTYPE_BYTES[param_dtype]
    n = param_count(cfg)
    shards = mesh.fsdp * mesh.tensor
    params = math.ceil(n * par / shards)
    b = math.ceil(batch_size / (mesh.data * mesh.fsdp * microbatches))
    tokens = b * seq_len
    per_layer = []
    for layer in range(cfg.n_layers):
        elements = activation_elements_per_token_layer(cfg, layer, seq_len, mesh.tensor, flash)
        routing = 0.0
        if cfg.moe is not None and cfg.moe.is_moe_layer(layer):
            # float32 one-hots: per-choice slots [k, E, C], dispatch and combine [E, C] per token
            routing = (2 + cfg.moe.top_k) * cfg.moe.n_experts * cfg.moe.capacity(seq_len) * 4 / mesh.tensor
        per_layer.append(tokens * (elements * act + routing))
    if remat:
        blocks = cfg.n_layers * tokens * cfg.d_model * act + max(per_layer)
    else:
        blocks = sum(per_layer)
    head = tokens * cfg.vocab_size / mesh.tensor * (act + 8)
    return MemoryPlan(params_bytes=params, grads_bytes=params * (2 if microbatches > 1 else 1),
                      optimizer_bytes=math.ceil(n * ADAM_MOMENT_BYTES / shards),
                      activation_bytes=math.ceil(blocks + head), capacity_bytes=int(capacity_bytes),
                      usable_fraction=usable_fraction, device=device, mesh=mesh, sequences_per_device=b,
                      seq_len=seq_len, remat=remat)


def check_fits(cfg: ModelShape, **kwargs: Any) -> MemoryPlan:
    """:func:`plan_memory` with the same arguments, refusing a plan that does not fit.

    Raises:
        MemoryPlanError: ``total > usable_fraction * capacity``; the message is
            :meth:`MemoryPlan.describe` plus what to change.
    """
    plan = plan_memory(cfg, **kwargs)
    if not plan.fits:
        raise MemoryPlanError(
            f"training will not fit in device memory: {plan.describe()}. Use more microbatches, a smaller preset, "
            f"batch_size or seq_len, more devices (fsdp shards parameters and optimizer state), or compute_dtype "
            f"bfloat16")
    return plan


_QUANTITY = re.compile(r"^([0-9.]+)([KMGTPE]i?|[kmgtpe])?$")
_UNITS = {None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_bytes(quantity: str) -> int:
    """Bytes of a Kubernetes memory quantity (``"8Gi"``, ``"16G"``, ``"512Mi"``).

    Raises:
        ValueError: not a quantity of that form.
    """
    match = _QUANTITY.match(str(quantity).strip())
    if not match:
        raise ValueError(f"memory quantity {quantity!r}: expected digits and a unit such as Gi, G, Mi")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def device_memory(resources: Any) -> tuple[str, int, int, int] | None:
    """``(label, bytes per device, devices, TPU slices)`` of a recipe's ``train.resources``.

    TPU: ``hbm_gib_per_chip`` GiB per chip, chips x slices devices; GPU: ``memory_gb`` (decimal
    GB, the datasheet figure) per GPU, count x nodes devices (tables in tidal/launch/resources.py);
    CPU on GKE: the pod's ``memory`` limit, one device per node. None for a local CPU run (the
    machine's memory is not known when the recipe is planned).
    """
    acc = resources.accelerator
    if acc.kind == "tpu":
        tpu, topo = tpu_slice(acc.type, acc.topology)
        return (f"{tpu.gke_accelerator} ({tpu.name}) {tpu.hbm_gib_per_chip} GiB HBM per chip",
                tpu.hbm_gib_per_chip * GIB, topo.chips * acc.slices, acc.slices)
    if acc.kind == "gpu":
        gpu = gpu_type(acc.type, acc.count)
        return f"{gpu.gke_accelerator} {gpu.memory_gb} GB", gpu.memory_gb * GB, acc.count * acc.nodes, 1
    if resources.launcher == "gke":
        return f"cpu pod memory {resources.memory}", quantity_bytes(resources.memory), acc.nodes, 1
    return None


def default_mesh(n_devices: int, n_slices: int = 1, requested: dict[str, int | None] | None = None) -> MeshShape:
    """The mesh tidal/train/mesh.py ``mesh_shape`` builds: ``tensor`` 1, ``data`` = TPU slices,
    ``fsdp`` the rest, unless ``requested`` fixes axes (a ``None`` axis takes the rest).

    Raises:
        MemoryPlanError: the requested sizes cannot multiply to ``n_devices``.
    """
    sizes: dict[str, int | None] = {"data": None, "fsdp": None, "tensor": None} | dict(requested or {})
    if sizes["tensor"] is None:
        sizes["tensor"] = 1
    if sizes["data"] is None:
        sizes["data"] = n_slices if sizes["fsdp"] is None else None
    fixed = math.prod(v for v in sizes.values() if v is not None)
    free = [axis for axis, v in sizes.items() if v is None]
    if free and n_devices % fixed == 0:
        sizes[free[0]] = n_devices // fixed
    if None in sizes.values() or math.prod(sizes.values()) != n_devices:
        raise MemoryPlanError(f"mesh {requested} does not multiply to the {n_devices} devices of the run")
    return MeshShape(**sizes)


def check_recipe(recipe: Any) -> MemoryPlan | None:
    """Refuse a recipe whose training step cannot fit its ``train.resources`` accelerator.

    Uses ``train.model`` (presets resolved), ``tokenizer.vocab_size`` (the tokenizer's target
    size; in ``mode: file`` an estimate), ``tokenize.seq_len - 1`` input tokens, the global
    ``train.batch_size`` and the mesh (``train.mesh`` if the recipe has one, else the default of
    :func:`default_mesh`).

    Returns:
        The plan, or None for a local CPU run (nothing to check against).

    Raises:
        MemoryPlanError: the plan does not fit (every term and the capacity in GiB).
    """
    resources = recipe.train.resources
    memory = device_memory(resources)
    if memory is None:
        return None
    label, capacity, n_devices, n_slices = memory
    requested = getattr(recipe.train, "mesh", None)
    if requested is not None and hasattr(requested, "model_dump"):
        requested = requested.model_dump()
    mesh = default_mesh(n_devices, n_slices, requested)
    rows, micro = recipe.train.batch_size // recipe.train.microbatches, recipe.train.microbatches
    if rows % (mesh.data * mesh.fsdp):  # the trainer refuses it on the booked chips (tidal/train/build.py)
        raise MemoryPlanError(f"train.batch_size {recipe.train.batch_size} in {micro} microbatch(es): each one's "
                              f"{rows} sequences must divide over the data x fsdp = {mesh.data * mesh.fsdp} devices "
                              f"of the run")
    cfg = recipe.train.model.shape(recipe.tokenizer.vocab_size)
    try:
        return check_fits(cfg, batch_size=recipe.train.batch_size, seq_len=recipe.tokenize.seq_len - 1,
                          mesh=mesh, capacity_bytes=capacity, device=label, microbatches=recipe.train.microbatches)
    except MemoryPlanError as err:
        raise MemoryPlanError(f"train (model, batch_size, resources.accelerator) with tokenize.seq_len "
                              f"{recipe.tokenize.seq_len}: {err}") from None
