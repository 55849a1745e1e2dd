"""Recipe sections of training: model shape (presets, GQA, MoE), optimizer, device mesh and
the training loop. Hashed into the train step's id, except ``train.resources``
(tidal/recipe/operations.py), which says where training runs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer, model_validator
from pydantic import Strict as StrictType

from tidal.config import Fraction, PositiveInt, Strict
from tidal.recipe.operations import ResourceConfig


class MoEConfig(Strict):
    """Mixture-of-experts feed-forward layers (tidal/train/moe.py; defaults and sources in
    tidal/train/flops.py MoEConfig)."""

    n_experts: PositiveInt = Field(description="E, expert SwiGLUs per MoE layer")
    top_k: PositiveInt = Field(default=2, description="experts per token (1: Switch; 2: GShard/ST-MoE)")
    capacity_factor: Annotated[float, Field(gt=0.0, le=1e3)] = Field(
        default=1.25, description="expert slots per sequence = ceil(capacity_factor * T * top_k / E); "
        "choices past them are dropped and counted")
    aux_loss_weight: Annotated[float, Field(ge=0.0, le=1e3)] = Field(
        default=0.01, description="weight of the Switch load-balancing loss")
    router_z_loss_weight: Annotated[float, Field(ge=0.0, le=1e3)] = Field(
        default=0.001, description="weight of the ST-MoE router z-loss")
    every: PositiveInt = Field(
        default=1, description="block i is MoE when (i + 1) % every == 0; at most the model's n_layers")

    @model_validator(mode="after")
    def _top_k(self) -> MoEConfig:
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed n_experts ({self.n_experts})")
        return self


class ModelConfig(Strict):
    """Decoder-only transformer shape (vocab size comes from the tokenizer).

    ``preset`` (tidal/train/presets.py: tiny, small, 125m, 350m, 760m, 1b) fills the shape
    fields not written here; without a preset the defaults below apply. The resolved shape, not
    the preset's name, is what a step config holds and hashes; optional fields left at their
    defaults (``n_kv_heads`` = ``n_heads``, no ``moe``, ``compute_dtype: float32``) are left out
    of it, so recipes that do not use them keep their step ids.
    """

    preset: str | None = Field(default=None, description="named size (tidal/train/presets.py); fields written beside it win")
    d_model: PositiveInt = 128
    n_layers: PositiveInt = 2
    n_heads: PositiveInt = 4
    d_ff: PositiveInt = 512
    n_kv_heads: PositiveInt | None = Field(
        default=None, description="key/value heads (grouped-query attention); must divide n_heads; default n_heads")
    moe: MoEConfig | None = Field(default=None, description="mixture-of-experts feed-forward layers; default dense")
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="activation dtype; parameters, softmax and loss stay float32")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            from tidal.train.presets import preset_shape

            data = preset_shape(data["preset"]) | dict(data)
        return data

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        from tidal.train.flops import ModelConfig as Shape

        Shape.from_config(self.model_dump(), vocab_size=1)  # the trainer's own rules (GQA, RoPE, MoE)
        return self

    @model_validator(mode="after")
    def _moe_layer_exists(self) -> ModelConfig:
        # Block i (0-based) is MoE when (i + 1) % every == 0 (tidal/train/flops.py MoEConfig.is_moe_layer),
        # so the MoE blocks are every-1, 2*every-1, ...: none at all when every > n_layers.
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
        for key, default in (("moe", None), ("compute_dtype", "float32")):
            if data.get(key) == default:
                data.pop(key, None)
        return data


class OptimizerConfig(Strict):
    """AdamW with linear warmup and cosine decay (Loshchilov & Hutter 2019)."""

    lr: Annotated[float, Field(gt=0.0, lt=1.0)] = 3e-3
    min_lr_ratio: Fraction = 0.1
    warmup_steps: Annotated[int, StrictType(), Field(ge=0)] = 20
    weight_decay: Annotated[float, Field(ge=0.0)] = 0.1
    b1: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.9
    b2: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95
    grad_clip: Annotated[float, Field(gt=0.0)] = 1.0

class MeshConfig(Strict):
    """Explicit device-mesh axis sizes (tidal/train/mesh.py); an axis left null is derived:
    tensor 1, data = TPU slices, fsdp = the remaining devices. Hashed: another mesh changes
    the order of floating-point reductions, hence the loss bits."""

    data: PositiveInt | None = Field(default=None, description="pure data-parallel replicas")
    fsdp: PositiveInt | None = Field(default=None, description="devices sharing params/optimizer state (FSDP)")
    tensor: PositiveInt | None = Field(default=None, description="tensor-parallel devices (heads, d_ff)")


class TrainConfig(Strict):
    """Training loop: steps, batch, checkpoint and eval cadence."""

    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    steps: PositiveInt = 200
    batch_size: PositiveInt = 16
    checkpoint_every: PositiveInt = 50
    keep_checkpoints: PositiveInt = 2
    eval_every: PositiveInt = 50
    eval_batches: PositiveInt = 4
    log_every: PositiveInt = 10
    checkpoint_permanent_every: PositiveInt | None = Field(
        default=None, description="also keep every checkpoint whose step is a multiple of this, forever")
    mesh: MeshConfig | None = Field(default=None, description="device mesh axis sizes; null: derived")
    resources: ResourceConfig = ResourceConfig()

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        # unset optional fields stay out of the step config, so existing recipes keep their step ids
        data = handler(self)
        for key in ("checkpoint_permanent_every", "mesh"):
            if key in data and data[key] is None:
                del data[key]
        return data

