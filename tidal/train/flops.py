"""Size, training FLOPs and MFU of the trainer's transformer (:mod:`tidal.train.model`), without JAX.

Light on purpose: importing this module imports no JAX or flax, so DAG parsing
(:mod:`tidal.scaling.suite` plans FLOPs per grid point) and recipe validation (the memory
planner) can use the trainer's own formulas; :mod:`tidal.train.model` re-exports
:class:`ModelConfig`, :func:`param_count` and :func:`flops_per_token` from here.

Parameter count (exact for :class:`tidal.train.model.Transformer`; checked against the
initialised parameters by ``tests/train/test_train_model.py`` and ``tests/train/test_moe.py``),
with ``kv = n_kv_heads * head_dim`` (``kv == d`` without grouped-query attention)::

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
from dataclasses import dataclass
from typing import Any

from tidal.train.presets import resolve_preset

COMPUTE_DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("einsum", "xla", "cudnn")


def _int(value: Any, where: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"train config '{where}' must be an int >= {minimum}, got {value!r}")
    return value


def _float(value: Any, where: str, low: float, high: float, low_open: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high
    if not ok or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ValueError(f"train config '{where}' must be a number in {bound}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts feed-forward layers (see :mod:`tidal.train.moe` for the routing).

    Attributes:
        n_experts: E, expert SwiGLUs per MoE layer (each of width ``d_ff``).
        top_k: experts per token (1: Switch, Fedus et al. 2021; 2: GShard / ST-MoE).
        capacity_factor: expert buffer size ``C = ceil(capacity_factor * T * top_k / E)`` token
            slots per sequence of T tokens; assignments past C are dropped and counted.
            Default 1.25 (ST-MoE, Zoph et al. 2022, §2.1 / Table 5, train capacity factor).
        aux_loss_weight: weight of the load-balancing loss (Switch eq. 4); default 0.01 (Switch §2.2).
        router_z_loss_weight: weight of the router z-loss (ST-MoE eq. 5); default 0.001 (ST-MoE §3.1).
        every: layer ``i`` (0-based) is an MoE layer when ``(i + 1) % every == 0``; 1: all
            layers; 2: every other layer (Switch, GShard); 4: ST-MoE's spacing.
    """

    n_experts: int
    top_k: int = 2
    capacity_factor: float = 1.25
    aux_loss_weight: float = 0.01
    router_z_loss_weight: float = 0.001
    every: int = 1

    KEYS = ("n_experts", "top_k", "capacity_factor", "aux_loss_weight", "router_z_loss_weight", "every")

    def is_moe_layer(self, layer: int) -> bool:
        """True when 0-based block ``layer`` uses the MoE feed-forward."""
        return (layer + 1) % self.every == 0

    def capacity(self, tokens_per_group: int) -> int:
        """Expert buffer slots C per group (one sequence) of ``tokens_per_group`` tokens."""
        return max(1, math.ceil(self.capacity_factor * tokens_per_group * self.top_k / self.n_experts))

    @classmethod
    def from_config(cls, moe: dict[str, Any]) -> MoEConfig:
        """Build from ``config["model"]["moe"]``; only ``n_experts`` is required.

        Raises:
            ValueError: naming the unknown key or the violated rule (``1 <= top_k <=
                n_experts``, ``capacity_factor > 0``, weights >= 0, ``every >= 1``).
        """
        if not isinstance(moe, dict):
            raise ValueError(f"train config 'model.moe' must be a mapping, got {moe!r}")  # noqa: TRY004
        unknown = sorted(set(moe) - set(cls.KEYS))
        if unknown or "n_experts" not in moe:
            raise ValueError(f"train config 'model.moe': unknown keys {unknown}, n_experts "
                             f"{'given' if 'n_experts' in moe else 'missing'}; valid keys {list(cls.KEYS)}")
        n_experts = _int(moe["n_experts"], "model.moe.n_experts")
        out = cls(n_experts=n_experts,
                  top_k=_int(moe.get("top_k", cls.top_k), "model.moe.top_k"),
                  capacity_factor=_float(moe.get("capacity_factor", cls.capacity_factor),
                                         "model.moe.capacity_factor", 0.0, 1e3, low_open=True),
                  aux_loss_weight=_float(moe.get("aux_loss_weight", cls.aux_loss_weight),
                                         "model.moe.aux_loss_weight", 0.0, 1e3),
                  router_z_loss_weight=_float(moe.get("router_z_loss_weight", cls.router_z_loss_weight),
                                              "model.moe.router_z_loss_weight", 0.0, 1e3),
                  every=_int(moe.get("every", cls.every), "model.moe.every"))
        if out.top_k > out.n_experts:
            raise ValueError(f"train config 'model.moe.top_k' ({out.top_k}) must not exceed "
                             f"n_experts ({out.n_experts})")
        return out


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer.

    Attributes:
        vocab_size: V, number of token ids (from the tokenizer's ``tokenizer_meta.json``).
        d_model: d, width of the residual stream.
        n_layers: L, number of transformer blocks.
        n_heads: query heads; ``d_model % n_heads == 0`` and the head dim is even (RoPE).
        d_ff: hidden width of the SwiGLU MLP (of each expert, with MoE).
        n_kv_heads: key/value heads of grouped-query attention (Ainslie et al. 2023, "GQA");
            must divide ``n_heads``; None or ``n_heads``: multi-head attention (stored as
            ``n_heads``); 1: multi-query attention (Shazeer 2019).
        moe: mixture-of-experts feed-forward layers, or None for dense SwiGLU everywhere.
        compute_dtype: ``"float32"`` or ``"bfloat16"``: dtype of activations and matmul inputs;
            parameters, router, softmax and loss stay float32 in both.
        remat: recompute each block's activations in the backward pass (``flax.linen.remat``,
            i.e. ``jax.checkpoint``); same values, less memory, about 1/3 more FLOPs. Set in
            code (benchmarks); not a step-config key.
        attention: ``"einsum"`` (explicit masked softmax, the default), or
            ``jax.nn.dot_product_attention`` with ``implementation="xla"`` or ``"cudnn"``
            (fused flash attention on NVIDIA GPUs). Set in code; not a step-config key.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    n_kv_heads: int | None = None
    moe: MoEConfig | None = None
    compute_dtype: str = "float32"
    remat: bool = False
    attention: str = "einsum"

    def __post_init__(self) -> None:
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)

    @property
    def head_dim(self) -> int:
        """Per-head width ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: ``n_kv_heads * head_dim``."""
        return self.n_kv_heads * self.head_dim

    @property
    def n_moe_layers(self) -> int:
        """Number of blocks whose feed-forward is a mixture of experts."""
        return 0 if self.moe is None else sum(self.moe.is_moe_layer(i) for i in range(self.n_layers))

    KEYS = ("d_model", "n_layers", "n_heads", "d_ff")
    OPTIONAL_KEYS = ("preset", "n_kv_heads", "moe", "compute_dtype")

    @classmethod
    def from_config(cls, model: dict[str, Any], vocab_size: int) -> ModelConfig:
        """Build from the recipe's ``config["model"]``.

        ``model`` holds ``{d_model, n_layers, n_heads, d_ff}`` and optionally ``n_kv_heads``,
        ``moe`` (a :class:`MoEConfig` mapping), ``compute_dtype``, and ``preset`` (a name in
        :data:`tidal.train.presets.PRESETS` that supplies the four shape keys; keys written
        next to it win).

        Raises:
            ValueError: naming the missing/unknown key, the unknown preset (listing the valid
                ones) or the violated rule (positive ints, ``d_model`` divisible by ``n_heads``,
                even head dim for RoPE, ``n_kv_heads`` dividing ``n_heads``, MoE rules).
        """
        if not isinstance(model, dict):
            raise ValueError(f"train config 'model' must be a mapping, got {model!r}")  # noqa: TRY004
        model = resolve_preset(model)
        missing = [k for k in cls.KEYS if k not in model]
        unknown = sorted(set(model) - set(cls.KEYS) - set(cls.OPTIONAL_KEYS))
        if missing or unknown:
            raise ValueError(f"train config 'model': missing keys {missing}, unknown keys {unknown}; "
                             f"expected {list(cls.KEYS)} (or a preset) and optionally "
                             f"{list(cls.OPTIONAL_KEYS[1:])}")
        values = {k: model[k] for k in cls.KEYS} | {"vocab_size": vocab_size}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"train config 'model.{key}' must be a positive int, got {value!r}")
        n_kv = model.get("n_kv_heads")
        if n_kv is not None:
            _int(n_kv, "model.n_kv_heads")
        dtype = model.get("compute_dtype", "float32")
        if dtype not in COMPUTE_DTYPES:
            raise ValueError(f"train config 'model.compute_dtype' must be one of {COMPUTE_DTYPES}, got {dtype!r}")
        moe = model.get("moe")
        cfg = cls(**values, n_kv_heads=n_kv, compute_dtype=dtype,
                  moe=None if moe is None else MoEConfig.from_config(moe))
        if cfg.d_model % cfg.n_heads or cfg.head_dim % 2:
            raise ValueError(f"train config 'model': d_model={cfg.d_model} must be divisible by "
                             f"n_heads={cfg.n_heads} with an even head dim (RoPE rotates pairs)")
        if cfg.n_heads % cfg.n_kv_heads:
            raise ValueError(f"train config 'model.n_kv_heads' ({cfg.n_kv_heads}) must divide "
                             f"n_heads ({cfg.n_heads}): each key/value head serves a group of query heads")
        return cfg


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters N of :class:`tidal.train.model.Transformer` (formula in the module docstring)."""
    d, v, f = cfg.d_model, cfg.vocab_size, cfg.d_ff
    n_moe = cfg.n_moe_layers
    per_layer = 2 * d * d + 2 * d * cfg.kv_dim + 2 * d
    ffn = (cfg.n_layers - n_moe) * 3 * d * f
    if cfg.moe is not None:
        ffn += n_moe * (cfg.moe.n_experts * 3 * d * f + d * cfg.moe.n_experts)
    return v * d + cfg.n_layers * per_layer + ffn + d + d * v


def active_matmul_params(cfg: ModelConfig) -> int:
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


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
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


def mfu(tokens_per_s: float, cfg: ModelConfig, seq_len: int, peak_flops_per_s: float) -> float:
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
