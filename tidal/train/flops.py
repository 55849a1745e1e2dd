"""Size and training FLOPs of the trainer's transformer (:mod:`tidal.train.model`), without JAX.

Light on purpose: importing this module imports no JAX or flax, so DAG parsing
(:mod:`tidal.scaling.suite` plans FLOPs per grid point) can use the trainer's own formulas;
:mod:`tidal.train.model` re-exports :class:`ModelConfig`, :func:`param_count` and
:func:`flops_per_token` from here.

Parameter count (exact for :class:`tidal.train.model.Transformer`; checked against the
initialised parameters by ``tests/train/test_train_model.py``)::

    N = V*d                      input embedding
      + L * (4*d*d               W_q, W_k, W_v, W_o   (n_heads * head_dim == d)
             + 3*d*d_ff          W_gate, W_up, W_down
             + 2*d)              two RMSNorm scales
      + d                        final RMSNorm scale
      + d*V                      untied output head
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer.

    Attributes:
        vocab_size: V, number of token ids (from the tokenizer's ``tokenizer_meta.json``).
        d_model: d, width of the residual stream.
        n_layers: L, number of transformer blocks.
        n_heads: attention heads; ``d_model % n_heads == 0`` and the head dim is even (RoPE).
        d_ff: hidden width of the SwiGLU MLP.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int

    @property
    def head_dim(self) -> int:
        """Per-head width ``d_model // n_heads``."""
        return self.d_model // self.n_heads

    @classmethod
    def from_config(cls, model: dict[str, Any], vocab_size: int) -> ModelConfig:
        """Build from the recipe's ``config["model"]`` = ``{d_model, n_layers, n_heads, d_ff}``.

        Raises:
            ValueError: naming the missing/unknown key or the violated rule (positive ints,
                ``d_model`` divisible by ``n_heads``, even head dim for RoPE).
        """
        keys = ("d_model", "n_layers", "n_heads", "d_ff")
        missing = [k for k in keys if k not in model]
        unknown = sorted(set(model) - set(keys))
        if missing or unknown:
            raise ValueError(f"train config 'model': missing keys {missing}, unknown keys {unknown}; "
                             f"expected exactly {list(keys)}")
        values = {k: model[k] for k in keys} | {"vocab_size": vocab_size}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"train config 'model.{key}' must be a positive int, got {value!r}")
        cfg = cls(**values)
        if cfg.d_model % cfg.n_heads or cfg.head_dim % 2:
            raise ValueError(f"train config 'model': d_model={cfg.d_model} must be divisible by "
                             f"n_heads={cfg.n_heads} with an even head dim (RoPE rotates pairs)")
        return cfg


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters N of :class:`tidal.train.model.Transformer` (formula in the module docstring)."""
    d, v = cfg.d_model, cfg.vocab_size
    return v * d + cfg.n_layers * (4 * d * d + 3 * d * cfg.d_ff + 2 * d) + d + d * v


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward) for context length ``seq_len`` tokens.

    ``6 * N_matmul + 12 * L * d * T``: 2 FLOPs per multiply-add per matmul parameter in the
    forward pass and twice that in the backward pass (Kaplan et al. 2020, "Scaling Laws for
    Neural Language Models", Table 1: C_forward = 2N + 2 n_layer n_ctx d_attn), plus the
    attention score and value matmuls, 12 * L * H * Q * T with H * Q = d (Chowdhery et al.
    2022, "PaLM", Appendix B, the formula used for MFU). ``N_matmul`` counts only weights used
    in matmuls: every block's projections and the untied output head, not the input embedding
    (a lookup) nor the RMSNorm scales. The causal mask is not discounted, as in PaLM.

    Returns:
        FLOPs per trained token (an int).
    """
    d = cfg.d_model
    n_matmul = cfg.n_layers * (4 * d * d + 3 * d * cfg.d_ff) + d * cfg.vocab_size
    return 6 * n_matmul + 12 * cfg.n_layers * d * seq_len
