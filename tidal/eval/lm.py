"""tidal's model as an lm-evaluation-harness language model (:class:`TidalLM`, an ``lm_eval.api.model.LM``).

Invariant: every score is a pure function of the checkpoint, the tokenizer and the request; the batch
size changes only how many rows share one forward pass. Each batch is padded to ``batch_size`` rows of
``max_length`` tokens (right padding with id 0, rows of padding after the last request), so one compiled
program serves every batch, and a causal model's logits at position t never depend on later positions or
on other rows: scores at batch size 1 and 8 agree to float32 rounding (tests/eval/test_lm.py: 1e-5).

Text is encoded as the tokenize step encodes a document (no added special tokens, special-token text
as ordinary text, :func:`tidal.train.sample.load_tokenizer`) and each sequence starts with the
end-of-text id, as every packed training document does. A request longer than the training context
(``seq_len - 1`` tokens) keeps its last ``max_length`` tokens (left truncation, as lm-eval's HF model).

* ``loglikelihood``: ``sum log p(continuation | context)`` in nats (log-softmax in float64) and whether
  the continuation is the greedy one; trailing spaces of the context move to the continuation and
  the continuation's tokens are those of ``encode(context + continuation)`` after ``encode(context)``
  (lm-eval's HFLM rule, ``lm_eval/models/huggingface.py`` ``_encode_pair``).
* ``loglikelihood_rolling``: the whole text's log-likelihood, scored in disjoint windows of
  ``max_length`` tokens (``lm_eval.utils.get_rolling_token_windows`` with context 1).
* ``generate_until``: greedy (arg max, lowest id on a tie), at most ``max_gen_toks`` (default 32) new
  tokens, stopping at end-of-text or the first ``until`` string (cut off).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from tidal.train.sample import load_tokenizer
from tidal.train.trained import TrainedModel

DEFAULT_MAX_GEN_TOKS = 32


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """``log softmax`` over the last axis in float64 (``[..., V]`` -> same shape)."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


class TidalLM(LM):
    """lm-eval's three request types over a :class:`tidal.train.trained.TrainedModel` (module docstring).

    Args:
        model: a checkpoint read by :func:`tidal.train.trained.load_trained`.
        batch_size: rows per forward pass (recorded in ``results.json``); at least 1.
        max_length: tokens per forward pass; default the model's training context (``seq_len - 1``).

    Raises:
        ValueError: ``batch_size < 1``, or no ``max_length`` given for a model whose mixture is gone.
    """

    def __init__(self, model: TrainedModel, batch_size: int = 8, max_length: int | None = None) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size: must be at least 1, got {batch_size}")
        length = max_length if max_length is not None else model.context
        if length is None or length < 2:
            raise ValueError(f"{model.step_dir}: the training context is unknown; pass max_length")
        self.model = model
        self.batch_size = int(batch_size)
        self.max_length = int(length)
        self.tokenizer = load_tokenizer(model)
        self.eos_id = int(model.tokenizer_meta.get("eos_id", 0))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added; special-token text stays text)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids if text else []

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """``([eos] + context ids, continuation ids)`` by HFLM's rule (module docstring)."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        context_ids = self.encode(context)
        whole = self.encode(context + continuation)
        if whole[: len(context_ids)] != context_ids:  # the join merged across the boundary: encode apart
            return [self.eos_id, *context_ids], self.encode(continuation)
        return [self.eos_id, *context_ids], whole[len(context_ids):]

    def _forward(self, rows: list[list[int]]) -> np.ndarray:
        """Logits ``[len(rows), max_length, V]`` (float32) of rows of at most ``max_length`` ids."""
        buf = np.zeros((self.batch_size, self.max_length), np.int32)
        for i, row in enumerate(rows):
            buf[i, : len(row)] = row
        return self.model.logits(buf)[: len(rows)]

    def score(self, pairs: Iterable[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """``(sum log p(target ids | context ids) in nats, all greedy)`` for each ``(context, target)`` pair,
        ``batch_size`` pairs per forward pass. ``context`` must be non-empty (it starts with end-of-text).

        Raises:
            ValueError: an empty context or target.
        """
        items = list(pairs)
        out: list[tuple[float, bool]] = []
        for start in range(0, len(items), self.batch_size):
            rows, spans = [], []
            for context, target in items[start: start + self.batch_size]:
                if not context or not target:
                    raise ValueError("every scored pair needs a context (at least end-of-text) and a target")
                seq = (context + target)[-(self.max_length + 1):]
                n = min(len(target), len(seq) - 1)
                rows.append(seq[:-1])
                spans.append((len(seq) - 1 - n, seq[-n:]))
            logits = self._forward(rows)
            for i, (first, target) in enumerate(spans):
                window = logits[i, first: first + len(target)]
                logp = _log_softmax(window)
                ids = np.asarray(target)
                total = float(logp[np.arange(len(ids)), ids].sum())
                out.append((total, bool((window.argmax(axis=-1) == ids).all())))
        return out

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval ``loglikelihood``: ``(log p(continuation | context) in nats, is greedy)`` per request."""
        return self.score(self._pair(*req.args) for req in requests)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """lm-eval ``loglikelihood_rolling``: each text's total log-likelihood in nats (disjoint windows)."""
        windows: list[tuple[list[int], list[int]]] = []
        owner: list[int] = []
        for k, req in enumerate(requests):
            for window in get_rolling_token_windows(self.encode(req.args[0]), self.eos_id, self.max_length, 1):
                windows.append(make_disjoint_window(window))
                owner.append(k)
        totals = [0.0] * len(requests)
        for k, (logp, _) in zip(owner, self.score(windows), strict=True):
            totals[k] += logp
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """lm-eval ``generate_until``, greedy: the continuation of each context, cut at the first ``until``."""
        out: list[str] = []
        for start in range(0, len(requests), self.batch_size):
            batch = requests[start: start + self.batch_size]
            kwargs = [dict(req.args[1] or {}) for req in batch]
            budgets = [int(kw.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)) for kw in kwargs]
            limit = max(budgets)
            rows = [[self.eos_id, *self.encode(req.args[0])][-(self.max_length - limit):] for req in batch]
            new: list[list[int]] = [[] for _ in batch]
            done = [False] * len(batch)
            for _ in range(limit):
                logits = self._forward(rows)
                for i, row in enumerate(rows):
                    if done[i]:
                        continue
                    token = int(np.argmax(logits[i, len(row) - 1]))
                    row.append(token)
                    new[i].append(token)
                    done[i] = token == self.eos_id or len(new[i]) >= budgets[i]
                if all(done):
                    break
            for i, kw in enumerate(kwargs):
                ids = new[i][:-1] if new[i] and new[i][-1] == self.eos_id else new[i]
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                until = kw.get("until") or []
                for stop in [until] if isinstance(until, str) else until:
                    if stop and stop in text:
                        text = text.split(stop)[0]
                out.append(text)
        return out
