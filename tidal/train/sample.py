"""``tidal sample STEP --prompt TEXT``: text from a train step's checkpoint, greedy or seeded top-p.

The prompt is encoded as the tokenize step encodes a document (no added special tokens, special-token
text as ordinary text) and preceded by the end-of-text token, since in the packed training data every
document follows one. Each new token is chosen from tidal's own forward pass
(:meth:`tidal.train.trained.TrainedModel.logits`) over the whole sequence so far, no KV cache: the
sequence is padded to ``prompt + max_new_tokens`` so one compiled program serves every position (a
causal model's logits at position t do not depend on later positions; a mixture-of-experts model's
expert capacity depends on the sequence length, so there each prefix is run at its own length).
Generation stops after ``max_new_tokens`` or at the end-of-text token (not printed).

* greedy (the default): the arg max of the logits, the lowest id on a tie;
* sampling (``temperature``, ``top_p`` or ``seed`` given): nucleus sampling (Holtzman et al. 2020,
  "The Curious Case of Neural Text Degeneration", §3.1): probabilities ``softmax(logits / T)`` in
  float64; the smallest set of most probable tokens (ties by lower id) whose mass reaches ``top_p``;
  one draw from it renormalised, by the inverse CDF of one uniform of ``numpy.random.default_rng(seed)``
  per token. The same checkpoint, prompt and settings give the same text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tidal.train.config import ConfigError
from tidal.train.trained import TOKENIZER_FILE, TrainedModel


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen. ``temperature is None``: greedy; else nucleus sampling with ``top_p`` and ``seed``."""

    max_new_tokens: int = 32
    temperature: float | None = None
    top_p: float = 1.0
    seed: int = 0

    @classmethod
    def of(cls, max_new_tokens: int = 32, temperature: float | None = None, top_p: float | None = None,
           seed: int | None = None) -> Sampling:
        """Validated settings; sampling when any of ``temperature``, ``top_p``, ``seed`` is given
        (defaults 1.0, 1.0, 0).

        Raises:
            ConfigError: ``max_new_tokens < 1``; ``temperature`` not finite and > 0; ``top_p`` outside (0, 1];
                ``seed`` negative. The message names the option.
        """
        if max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens: must be at least 1, got {max_new_tokens}")
        if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
            raise ConfigError(f"--temperature: must be a finite number above 0, got {temperature}")
        if top_p is not None and not (0.0 < top_p <= 1.0):
            raise ConfigError(f"--top-p: must be in (0, 1], got {top_p}")
        if seed is not None and seed < 0:
            raise ConfigError(f"--seed: must be a non-negative integer, got {seed}")
        if temperature is None and top_p is None and seed is None:
            return cls(max_new_tokens)
        return cls(max_new_tokens, 1.0 if temperature is None else float(temperature),
                   1.0 if top_p is None else float(top_p), 0 if seed is None else int(seed))

    @property
    def greedy(self) -> bool:
        """True when tokens are the arg max (no temperature)."""
        return self.temperature is None


def nucleus_choice(logits: np.ndarray, temperature: float, top_p: float, uniform: float) -> int:
    """One token id from ``logits [V]`` by nucleus sampling (module docstring), given ``uniform`` in [0, 1)."""
    z = np.asarray(logits, np.float64) / temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")  # most probable first, lower id first on a tie
    mass = np.cumsum(probs[order])
    keep = min(int(np.searchsorted(mass, top_p * mass[-1], side="left")) + 1, len(order))
    cdf = mass[:keep] / mass[keep - 1]
    return int(order[min(int(np.searchsorted(cdf, uniform, side="right")), keep - 1)])


@dataclass
class Sample:
    """A generation: ``prompt_ids`` (with the leading end-of-text id), ``new_ids`` and the decoded texts."""

    prompt_ids: list[int]
    new_ids: list[int]
    text: str
    completion: str
    stopped_at_eos: bool


def load_tokenizer(model: TrainedModel):
    """The model's ``tokenizers.Tokenizer``, encoding special-token text as ordinary text (as tokenize does)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model.tokenizer_dir / TOKENIZER_FILE))
    tok.encode_special_tokens = True
    return tok


def encode_prompt(model: TrainedModel, prompt: str, settings: Sampling) -> list[int]:
    """``[eos] + ids(prompt)``.

    Raises:
        ConfigError: an empty prompt, one that encodes to no token, or prompt plus ``max_new_tokens`` longer
            than the model's training context.
    """
    if not prompt or not prompt.strip():
        raise ConfigError("--prompt: empty; give the text to continue")
    ids = load_tokenizer(model).encode(prompt, add_special_tokens=False).ids
    if not ids:
        raise ConfigError(f"--prompt: {prompt!r} encodes to no token with the tokenizer of {model.step_id}")
    eos = int(model.tokenizer_meta.get("eos_id", 0))
    total = 1 + len(ids) + settings.max_new_tokens
    if model.context is not None and total > model.context:
        raise ConfigError(f"--prompt / --max-new-tokens: {1 + len(ids)} prompt tokens (with end-of-text) + "
                          f"{settings.max_new_tokens} new = {total} exceed the {model.context} tokens the model was "
                          "trained on; shorten the prompt or lower --max-new-tokens")
    return [eos, *ids]


def generate(model: TrainedModel, prompt_ids: list[int], settings: Sampling) -> list[int]:
    """New token ids after ``prompt_ids`` (module docstring): at most ``max_new_tokens``, ending at end-of-text
    (included) when it is chosen."""
    eos = int(model.tokenizer_meta.get("eos_id", 0))
    rng = None if settings.greedy else np.random.default_rng(settings.seed)
    n = len(prompt_ids)
    padded = model.shape.moe is None
    buf = np.zeros((1, n + settings.max_new_tokens), np.int32)
    buf[0, :n] = prompt_ids
    new: list[int] = []
    for i in range(settings.max_new_tokens):
        end = n + i
        logits = model.logits(buf if padded else buf[:, :end])[0, end - 1]
        if rng is None:
            token = int(np.argmax(logits))
        else:
            token = nucleus_choice(logits, settings.temperature, settings.top_p, float(rng.random()))
        new.append(token)
        buf[0, end] = token
        if token == eos:
            break
    return new


def sample(model: TrainedModel, prompt: str, settings: Sampling) -> Sample:
    """Encode ``prompt``, :func:`generate`, decode (special tokens left out).

    Raises:
        ConfigError: a bad prompt (:func:`encode_prompt`).
    """
    prompt_ids = encode_prompt(model, prompt, settings)
    new = generate(model, prompt_ids, settings)
    eos = int(model.tokenizer_meta.get("eos_id", 0))
    stopped = bool(new) and new[-1] == eos
    kept = new[:-1] if stopped else new
    tok = load_tokenizer(model)
    return Sample(prompt_ids, new, tok.decode(prompt_ids + kept, skip_special_tokens=True),
                  tok.decode(kept, skip_special_tokens=True), stopped)
