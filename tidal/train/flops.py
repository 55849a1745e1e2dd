"""The trainer's model config, and the size, training FLOPs and MFU of its transformer
(:mod:`tidal.train.model`), without JAX.

:class:`ModelConfig` (with :class:`MoEConfig`) is the one schema of a model: a recipe's
``train.model`` is validated with it (``tidal.recipe.training`` composes it), the planner hashes
its dump, and the trainer reads the step config back with it. :class:`ModelShape` adds the
vocabulary size from the tokenizer; the formulas below take a shape.

Light on purpose: importing this module imports no JAX or flax (only pydantic), so DAG parsing
(:mod:`tidal.scaling.suite` plans FLOPs per grid point) and recipe validation (the memory
planner) can use the trainer's own formulas; :mod:`tidal.train.model` re-exports
:class:`ModelConfig`, :class:`ModelShape`, :func:`param_count` and :func:`flops_per_token` from here.

Parameter count (exact for :class:`tidal.train.model.Transformer`; checked against the
initialised parameters by ``tests/train/test_train_model.py`` and ``tests/train/test_moe.py``),
with ``kv = kv_heads * head_dim`` (``kv == d`` without grouped-query attention)::

    N = V*d                          input embedding
      + L * (2*d*d + 2*d*kv          W_q, W_o [d, d]; W_k, W_v [d, kv]
             + 2*d)                  two RMSNorm scales
      + L_dense * 3*d*d_ff           SwiGLU W_gate, W_up, W_down of the dense layers
      + L_moe * (E*3*d*d_ff + d*E)   E expert SwiGLUs and the router of the MoE layers
      + d                            final RMSNorm scale
      + d*V                          untied output head

Without MoE and GQA this is the original ``V*d + L*(4d² + 3d·d_ff + 2d) + d + d*V``: the
formulas for existing dense configs are unchanged.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer, model_validator

from tidal.config import PositiveInt, Strict
from tidal.train.presets import preset_shape

COMPUTE_DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("einsum", "xla", "cudnn")
LossWeight = Annotated[float, Field(ge=0.0, le=1e3)]


class MoEConfig(Strict):
    """Mixture-of-experts feed-forward layers (see :mod:`tidal.train.moe` for the routing).

    Defaults and their sources: ``capacity_factor`` 1.25 (ST-MoE, Zoph et al. 2022, §2.1 /
    Table 5, train capacity factor); ``aux_loss_weight`` 0.01 (Switch, Fedus et al. 2021, §2.2);
    ``router_z_loss_weight`` 0.001 (ST-MoE §3.1). ``every``: 2 is Switch's and GShard's spacing,
    4 ST-MoE's.
    """

    n_experts: PositiveInt = Field(description="E, expert SwiGLUs per MoE layer (each of width d_ff)")
    top_k: PositiveInt = Field(default=2, description="experts per token (1: Switch; 2: GShard/ST-MoE)")
    capacity_factor: Annotated[float, Field(gt=0.0, le=1e3)] = Field(
        default=1.25, description="expert slots per sequence = ceil(capacity_factor * T * top_k / E); "
        "choices past them are dropped and counted")
    aux_loss_weight: LossWeight = Field(default=0.01, description="weight of the Switch load-balancing loss (eq. 4)")
    router_z_loss_weight: LossWeight = Field(default=0.001, description="weight of the ST-MoE router z-loss (eq. 5)")
    every: PositiveInt = Field(
        default=1, description="block i is MoE when (i + 1) % every == 0; at most the model's n_layers")

    @model_validator(mode="after")
    def _top_k(self) -> MoEConfig:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed n_experts ({self.n_experts})")
        return self

    def is_moe_layer(self, layer: int) -> bool:
        """True when 0-based block ``layer`` uses the MoE feed-forward."""
        return (layer + 1) % self.every == 0

    def capacity(self, tokens_per_group: int) -> int:
        """Expert buffer slots C per group (one sequence) of ``tokens_per_group`` tokens."""
        return max(1, math.ceil(self.capacity_factor * tokens_per_group * self.top_k / self.n_experts))


class ModelConfig(Strict):
    """Decoder-only transformer shape, as a recipe's ``train.model`` and a step config write it.

    ``preset`` (:mod:`tidal.train.presets`: tiny, small, 125m, 350m, 760m, 1b) fills the shape
    fields not written beside it, once, when the model is validated; without a preset the
    defaults below apply. The resolved shape, not the preset's name, is what a step config holds
    and hashes; optional fields left at their defaults (``n_kv_heads`` = ``n_heads``, no ``moe``,
    ``compute_dtype: float32``, no ``remat``) are left out of it, so recipes that do not use them keep their
    step ids. The vocabulary size comes from the tokenizer: :meth:`shape` adds it.
    """

    preset: str | None = Field(
        default=None, description="named size (tidal/train/presets.py); fields written beside it win")
    d_model: PositiveInt = Field(default=128, description="d, width of the residual stream")
    n_layers: PositiveInt = Field(default=2, description="L, number of transformer blocks")
    n_heads: PositiveInt = Field(default=4, description="query heads; d_model / n_heads is the (even) head dim")
    d_ff: PositiveInt = Field(default=512, description="hidden width of the SwiGLU MLP (of each expert, with MoE)")
    n_kv_heads: PositiveInt | None = Field(
        default=None, description="key/value heads (grouped-query attention, Ainslie et al. 2023); must divide "
        "n_heads; 1: multi-query attention; default n_heads")
    moe: MoEConfig | None = Field(default=None, description="mixture-of-experts feed-forward layers; default dense")
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="activation and matmul-input dtype; parameters, router, softmax and loss "
        "stay float32")
    remat: bool = Field(
        default=False, description="recompute each block's activations in the backward pass (flax.linen.remat): "
        "same values, activations of one block instead of every block, about 1/3 more FLOPs (Chen et al. 2016)")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            data = preset_shape(data["preset"]) | dict(data)  # UnknownPreset lists the valid names
        return data

    @model_validator(mode="after")
    def _shape_rules(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head dim d_model / n_heads = {self.head_dim} must be even (RoPE rotates pairs)")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads ({self.kv_heads}) must divide n_heads ({self.n_heads}): each key/value "
                             f"head serves a group of query heads")
        # Block i (0-based) is MoE when (i + 1) % every == 0 (MoEConfig.is_moe_layer), so the MoE blocks are
        # every-1, 2*every-1, ...: none at all when every > n_layers.
        if self.moe is not None and self.moe.every > self.n_layers:
            raise ValueError(
                f"moe.every ({self.moe.every}) exceeds n_layers ({self.n_layers}): block i is MoE when "
                f"(i + 1) % every == 0, so no block would be MoE; use every <= n_layers (1: every block, "
                f"{self.n_layers}: only the last) or drop `moe` for a dense model")
        return self

    @model_serializer(mode="wrap")
    def _canonical(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        data.pop("preset", None)
        if data.get("n_kv_heads") in (None, self.n_heads):
            data.pop("n_kv_heads", None)
        for key, default in (("moe", None), ("compute_dtype", "float32"), ("remat", False)):
            if data.get(key) == default:
                data.pop(key, None)
        return data

    @property
    def head_dim(self) -> int:
        """Per-head width ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or ``n_heads`` without grouped-query attention."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def n_moe_layers(self) -> int:
        """Number of blocks whose feed-forward is a mixture of experts."""
        return 0 if self.moe is None else sum(self.moe.is_moe_layer(i) for i in range(self.n_layers))

    def shape(self, vocab_size: int, **options: Any) -> ModelShape:
        """This model with the tokenizer's vocabulary size (and code-only ``options``: ``attention``, or a
        ``remat`` that overrides the recipe's): what the network, the size and FLOPs formulas and the memory plan take.

        Raises:
            pydantic.ValidationError: ``vocab_size`` not a positive int, or a bad option.
        """
        fields = {name: getattr(self, name) for name in ModelConfig.model_fields if name != "preset"}
        return ModelShape(**(fields | options), vocab_size=vocab_size)


class ModelShape(ModelConfig):
    """A :class:`ModelConfig` plus what a config does not say: the vocabulary size V (from the
    tokenizer's ``tokenizer_meta.json``) and the attention implementation, set in code by benchmarks,
    never in a recipe or step config. Built by :meth:`ModelConfig.shape`."""

    vocab_size: PositiveInt = Field(description="V, number of token ids (from the tokenizer)")
    attention: Literal["einsum", "xla", "cudnn"] = Field(
        default="einsum", description="einsum: explicit masked softmax; xla or cudnn: jax.nn.dot_product_attention "
        "with that implementation (cudnn: fused flash attention on NVIDIA GPUs)")


def param_count(cfg: ModelShape) -> int:
    """Number of parameters N of :class:`tidal.train.model.Transformer` (formula in the module docstring)."""
    d, v, f = cfg.d_model, cfg.vocab_size, cfg.d_ff
    n_moe = cfg.n_moe_layers
    per_layer = 2 * d * d + 2 * d * cfg.kv_dim + 2 * d
    ffn = (cfg.n_layers - n_moe) * 3 * d * f
    if cfg.moe is not None:
        ffn += n_moe * (cfg.moe.n_experts * 3 * d * f + d * cfg.moe.n_experts)
    return v * d + cfg.n_layers * per_layer + ffn + d + d * v


def active_matmul_params(cfg: ModelShape) -> int:
    """Matmul weights one token passes through: ``N_matmul`` of :func:`flops_per_token`.

    Every block's attention projections, the dense SwiGLUs, per MoE layer the router and
    ``top_k`` experts (not all E: the active parameters, as Fedus et al. 2021 count FLOPs
    per token), and the output head. Not the input embedding (a lookup) nor RMSNorm scales.
    """
    d, f = cfg.d_model, cfg.d_ff
    n_moe = cfg.n_moe_layers
    n = cfg.n_layers * (2 * d * d + 2 * d * cfg.kv_dim) + (cfg.n_layers - n_moe) * 3 * d * f + d * cfg.vocab_size
    if cfg.moe is not None:
        n += n_moe * (cfg.moe.top_k * 3 * d * f + d * cfg.moe.n_experts)
    return n


def flops_per_token(cfg: ModelShape, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward) for context length ``seq_len`` tokens.

    ``6 * N_matmul + 12 * L * d * T``: 2 FLOPs per multiply-add per matmul parameter in the
    forward pass and twice that in the backward pass (Kaplan et al. 2020, "Scaling Laws for
    Neural Language Models", Table 1: C_forward = 2N + 2 n_layer n_ctx d_attn; Hoffmann et al.
    2022, "Chinchilla", Appendix F uses the same 6N rule), plus the attention score and value
    matmuls, 12 * L * H * Q * T with H * Q = d query-head width (Chowdhery et al. 2022, "PaLM",
    Appendix B, the formula used for MFU; Korthikanti et al. 2022, "Reducing Activation
    Recomputation", §6, count the same terms). ``N_matmul`` is :func:`active_matmul_params`:
    every block's projections (with GQA the smaller key/value ones), the output head and, with
    MoE, only the ``top_k`` active experts plus the router; not the input embedding (a lookup),
    not the RMSNorm scales, not the MoE dispatch/combine einsums nor the padding of expert
    buffers (overheads, not model FLOPs). The causal mask is not discounted, as in PaLM.
    Remat's recomputation is not counted either (MFU, not hardware FLOPs utilisation).

    Returns:
        FLOPs per trained token (an int).
    """
    return 6 * active_matmul_params(cfg) + 12 * cfg.n_layers * cfg.d_model * seq_len


# Peak dense bf16 matrix FLOP/s per device (no 2:4 sparsity), from the vendors' datasheets:
# NVIDIA H100 / H200 datasheets (www.nvidia.com/en-us/data-center/h100/, .../h200/): "BF16 Tensor
# Core 1,979 teraFLOPS" (SXM; 1,671 NVL; 1,513 H100 PCIe) are *with sparsity*, so dense is half;
# NVIDIA A100 datasheet (www.nvidia.com/en-us/data-center/a100/): BF16 Tensor Core 312 TFLOPS dense;
# NVIDIA L4 datasheet: BF16 242 TFLOPS with sparsity (121 dense); Google Cloud TPU system
# architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e): peak bf16 compute per chip
# 275 (v4), 197 (v5e), 459 (v5p), 918 (v6e) TFLOPS.
PEAK_BF16_FLOPS: dict[str, float] = {
    "h100-sxm": 989.5e12,
    "h100-nvl": 835.5e12,
    "h100-pcie": 756.5e12,
    "h200-sxm": 989.5e12,
    "h200-nvl": 835.5e12,
    "a100": 312e12,
    "l4": 121e12,
    "tpu-v4": 275e12,
    "tpu-v5e": 197e12,
    "tpu-v5p": 459e12,
    "tpu-v6e": 918e12,
}

# ``jax.devices()[0].device_kind`` strings -> table key; first match wins. Examples of the
# strings JAX reports: "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200",
# "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "TPU v4", "TPU v5 lite" (v5e), "TPU v5" / "TPU v5p",
# "TPU v6 lite" (v6e).
DEVICE_KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"h200.*nvl", "h200-nvl"),
    (r"h200", "h200-sxm"),
    (r"h100.*nvl", "h100-nvl"),
    (r"h100.*pcie", "h100-pcie"),
    (r"h100", "h100-sxm"),
    (r"a100", "a100"),
    (r"\bl4\b", "l4"),
    (r"tpu v4", "tpu-v4"),
    (r"tpu v5 ?(lite|e)\b", "tpu-v5e"),
    (r"tpu v5p?$", "tpu-v5p"),
    (r"tpu v6 ?(lite|e)\b", "tpu-v6e"),
)


class UnknownDeviceKind(ValueError):
    """A device kind with no peak FLOP/s row; the message lists the known ones."""


def peak_flops_per_s(device_kind: str) -> float:
    """Peak dense bf16 FLOP/s of one device, from its ``jax.Device.device_kind`` string.

    Raises:
        UnknownDeviceKind: no row matches (CPUs have none); names the known kinds.
    """
    kind = device_kind.strip().lower()
    for pattern, key in DEVICE_KIND_PATTERNS:
        if re.search(pattern, kind):
            return PEAK_BF16_FLOPS[key]
    raise UnknownDeviceKind(f"no peak bf16 FLOP/s known for device kind {device_kind!r}; "
                            f"known: {sorted(PEAK_BF16_FLOPS)} (tidal/train/flops.py)")


def mfu(tokens_per_s: float, cfg: ModelShape, seq_len: int, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: ``tokens_per_s * flops_per_token(cfg, seq_len) / peak_flops_per_s``.

    Args:
        tokens_per_s: trained tokens per second over all devices.
        seq_len: context length T in tokens (the model's input length).
        peak_flops_per_s: peak FLOP/s of all devices together (``n_devices *``
            :func:`peak_flops_per_s`).

    Returns:
        A fraction (0.5 = 50 %), as defined by Chowdhery et al. 2022 ("PaLM", Appendix B).
    """
    if peak_flops_per_s <= 0:
        raise ValueError(f"peak_flops_per_s must be positive, got {peak_flops_per_s!r}")
    return tokens_per_s * flops_per_token(cfg, seq_len) / peak_flops_per_s
