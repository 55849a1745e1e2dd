"""Named model sizes: a recipe writes ``model: {preset: 125m}`` instead of spelling out a shape.

Invariant: a preset is only a default for the shape fields. Resolution is
``defaults < preset < fields written in the recipe``, so ``{preset: 1b, n_layers: 4}`` is the 1b
shape with 4 layers, and the resolved shape (never the preset's name) is what enters a step's
config and hash: editing a row here changes the ids of the steps that use it, as it should.
The resolution happens once, when :class:`tidal.train.flops.ModelConfig` is validated.
This module is plain data and imports nothing heavy (DAG parsing and recipe validation use it).

Shapes are Llama-like (RoPE, RMSNorm, SwiGLU, untied embeddings; Touvron et al. 2023). Parameter
counts below are :func:`tidal.train.flops.param_count` at V = 32,000 (the Llama / TinyLlama
vocabulary; the recipe's tokenizer sets the real V), total and without the input embedding and
output head (``2·V·d``); ``tests/train/test_presets.py`` recomputes them:

========  ======  ===  =====  =====  =====  ===============  =================
preset    d       L    heads  kv     d_ff   N total (V=32k)  N non-embedding
========  ======  ===  =====  =====  =====  ===============  =================
tiny      64      2    4      4      256    4,227,392        131,392
small     256     4    4      4      768    19,794,176       3,410,176
125m      768     12   12     12     2048   134,105,856      84,953,856
350m      1024    24   16     16     2816   373,867,520      308,331,520
760m      1536    24   16     16     4096   777,856,512      679,552,512
1b        2048    22   32     4      5632   1,100,048,384    968,976,384
8b        4096    32   32     8      14336  7,241,732,096    6,979,588,096
========  ======  ===  =====  =====  =====  ===============  =================

Sources of the shapes: ``125m``, ``350m`` and ``760m`` take width, depth and heads of GPT-3
Small, Medium and Large (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1)
with a SwiGLU width of about ``8/3·d`` rounded up to a multiple of 256 (Shazeer 2020; the Llama
rule, Touvron et al. 2023 §2.2); ``1b`` is TinyLlama-1.1B exactly (Zhang et al. 2024,
"TinyLlama: An Open-Source Small Language Model", Table 1: d 2048, 22 layers, 32 heads, 4
key/value groups, intermediate size 5632). ``8b`` is Llama 3 8B's shape (Llama Team, Meta 2024,
"The Llama 3 Herd of Models", Table 3: d 4096, 32 layers, 32 heads, 8 key/value heads, FFN 14,336)
at the recipe's own vocabulary.
``tiny`` and ``small`` are CPU sizes of our own
(head dim 16 and 64).
"""

from __future__ import annotations

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 256},
    "small": {"d_model": 256, "n_layers": 4, "n_heads": 4, "d_ff": 768},
    "125m": {"d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 2048},
    "350m": {"d_model": 1024, "n_layers": 24, "n_heads": 16, "d_ff": 2816},
    "760m": {"d_model": 1536, "n_layers": 24, "n_heads": 16, "d_ff": 4096},
    "1b": {"d_model": 2048, "n_layers": 22, "n_heads": 32, "n_kv_heads": 4, "d_ff": 5632},
    "8b": {"d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "d_ff": 14336},
}


class UnknownPreset(ValueError):
    """A ``model.preset`` that is not a key of :data:`PRESETS`; the message lists the valid ones."""


def preset_shape(name: str) -> dict[str, int]:
    """The shape fields of preset ``name`` (a copy).

    Raises:
        UnknownPreset: naming the preset and every valid name.
    """
    if not isinstance(name, str) or name not in PRESETS:
        raise UnknownPreset(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return dict(PRESETS[name])

