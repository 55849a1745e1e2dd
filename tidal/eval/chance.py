"""What a downstream number means: each lm-eval metric of tidal's tasks beside its chance level and one line on
reading it (``tidal report``; issue 44: "``word_perplexity 4.83e+62``: is that expected for a 400-step model?").

Chance levels, by the task's ``output_type`` and metric (lm-evaluation-harness's definitions):

* ``multiple_choice`` ``acc`` / ``acc_norm``: a model that picks a choice at random scores the mean of
  ``1 / len(choices)`` over the task's examples (read from its data file).
* ``loglikelihood`` ``acc``: the target must be the model's greedy continuation, token for token; guessing gives
  about 0.
* ``loglikelihood_rolling`` ``bits_per_byte``: 8 for a model uniform over the 256 byte values (a model that knows
  the language: about 1 to 2); ``byte_perplexity`` 256, its ``2 ** bits_per_byte``; ``word_perplexity`` is
  ``2 ** (bits_per_byte * bytes per word)``, so it explodes where bits per byte stay high (1e+62 is what a model
  that never saw the language's script gives a text of long words, not a bug).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tidal.data.eval_tasks import task_data_file

UNIFORM_BITS_PER_BYTE = 8.0  # log2(256): one byte value out of 256, equally likely


@dataclass(frozen=True)
class Reference:
    """A metric's chance level (None where none is meaningful) and how to read the metric."""

    chance: float | None
    note: str


NOTES = {
    ("multiple_choice", "acc"): "picks the likeliest of the choices; random picking scores the chance level",
    ("multiple_choice", "acc_norm"): "acc with each choice's likelihood per byte (longer choices not penalized)",
    ("loglikelihood", "acc"): "the target word must be the greedy continuation; a small model scores about 0",
    ("loglikelihood", "perplexity"): "of the target word given its context; lower is better",
    ("loglikelihood_rolling", "bits_per_byte"): "lower is better; 8 is a uniform guess over byte values, a model "
                                                "that knows the language gets about 1 to 2; above 8, the model is "
                                                "sure of other text (a language or script it never trained on)",
    ("loglikelihood_rolling", "byte_perplexity"): "2 ** bits_per_byte; 256 is a uniform guess",
    ("loglikelihood_rolling", "word_perplexity"): "2 ** (bits per byte x bytes per word): huge (1e+60s) where a "
                                                  "model has not learned the language, so read bits_per_byte",
}


def _choice_chance(task: str) -> float | None:
    data, _ = task_data_file(task)
    counts = [len(json.loads(line).get("choices") or ()) for line in data.read_text().splitlines() if line.strip()]
    counts = [c for c in counts if c > 0]
    return sum(1 / c for c in counts) / len(counts) if counts else None


def reference(task: str, metric: str) -> Reference | None:
    """The chance level and note of ``metric`` of tidal's eval task ``task`` (tidal/eval/tasks), or None for a
    task or metric this module does not know (the report then shows the number alone).

    Raises:
        nothing: an unreadable task definition gives None.
    """
    try:
        _, config = task_data_file(task)
    except (ValueError, OSError):
        return None
    kind = config.get("output_type")
    note = NOTES.get((kind, metric))
    if note is None:
        return None
    if kind == "multiple_choice":
        return Reference(_choice_chance(task), note)
    chance = {"acc": 0.0, "bits_per_byte": UNIFORM_BITS_PER_BYTE, "byte_perplexity": 2 ** UNIFORM_BITS_PER_BYTE}
    return Reference(chance.get(metric), note)
