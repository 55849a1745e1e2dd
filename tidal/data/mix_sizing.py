"""How big the mixture is and how much each source gives: the arithmetic the mix step runs and
``tidal plan`` shows, in one place. Light (no numpy): the planner, the CLI and the report import it.

Per-source counts come from exact rational arithmetic (``fractions.Fraction`` of the weights'
decimal forms) with largest-remainder rounding (Hamilton's method), ties going to the earlier
source in sorted name order, so the counts are the same on every machine. The total comes from the
recipe's ``mixture.size`` (:mod:`tidal.data.mix_config`):

* ``smallest_source`` (the default): ``mixture.n_sequences`` if set, else the largest total whose
  counts fit every source without repeating a sequence; the source with the fewest sequences for
  its weight bounds the mixture and the other sources' remaining tokens go unused;
* ``token_budget``: ``ceil(tokens / seq_len)`` sequences; a source whose share exceeds what it has
  is up-sampled (its sequences repeated, whole passes then a subset; :func:`tidal.data.mix.mixture_order`)
  up to ``max_epochs`` passes; beyond that the mixture is refused, naming the source.

Units: counts are sequences of ``seq_len`` packed tokens (the tokenize step's ``n_sequences``);
tokens = sequences * seq_len. Epochs of a source = sequences taken / sequences it has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any


class MixtureError(ValueError):
    """The mixture cannot be built as configured (mismatched inputs, too few sequences ...)."""


def normalize_weights(weights: Mapping[str, float]) -> dict[str, Fraction]:
    """Weights as exact fractions summing to 1, keyed in sorted source order.

    Each weight is read as the decimal it is written as (``Fraction(repr(w))``: 0.3 -> 3/10,
    not the binary double just below it), so counts match what a person computes by hand.

    Raises:
        MixtureError: for an empty mapping or a weight that is not finite and > 0.
    """
    if not weights:
        raise MixtureError("mixture weights are empty")
    bad = {
        src: w
        for src, w in weights.items()
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0)
    }
    if bad:
        raise MixtureError(f"mixture weights must be finite and > 0, got {bad}")
    exact = {src: Fraction(repr(float(weights[src]))) for src in sorted(weights)}
    total = sum(exact.values())
    return {src: w / total for src, w in exact.items()}


def largest_remainder_counts(weights: Mapping[str, Fraction], total: int) -> dict[str, int]:
    """Split ``total`` sequences by ``weights`` (summing to 1): each source gets
    ``floor(w * total)`` and the leftover sequences go one each to the largest remainders
    (Hamilton's method), ties to the earlier source in ``weights`` order.

    Returns:
        ``{src: count}`` with counts summing to ``total``.
    """
    shares = {src: w * total for src, w in weights.items()}
    counts = {src: math.floor(share) for src, share in shares.items()}
    leftover = total - sum(counts.values())
    order = sorted(
        weights, key=lambda src: (-(shares[src] - counts[src]), list(weights).index(src))
    )
    for src in order[:leftover]:
        counts[src] += 1
    return counts


def largest_feasible_total(weights: Mapping[str, Fraction], available: Mapping[str, int]) -> int:
    """The largest N whose :func:`largest_remainder_counts` fit ``available`` (sequences per
    source), i.e. the biggest mixture with no repeated sequence.

    Largest-remainder counts are not monotone in N (Alabama paradox), so this searches down
    from the bound ``N < (available + 1) / w`` that every source must satisfy.
    """
    upper = min(
        min(math.floor((available[src] + 1) / w) for src, w in weights.items()),
        sum(available.values()),
    )
    for total in range(upper, 0, -1):
        counts = largest_remainder_counts(weights, total)
        if all(counts[src] <= available[src] for src in weights):
            return total
    return 0


def _size(size: Any) -> dict[str, Any]:
    """``mixture.size`` as a plain dict (a model, its dump, or None for the default)."""
    if size is None:
        return {"mode": "smallest_source"}
    return size if isinstance(size, dict) else size.model_dump()


def requested_total(size: Any, n_sequences: int | None, seq_len: int) -> int | None:
    """The total sequences the config fixes before looking at the data: ``n_sequences``, or
    ``ceil(size.tokens / seq_len)`` for ``token_budget`` (at least the budget, in whole
    sequences); None when the smallest source decides (``smallest_source`` without n_sequences)."""
    size = _size(size)
    if size["mode"] == "token_budget":
        return -(-size["tokens"] // seq_len)
    return n_sequences


def mixture_counts(weights: Mapping[str, Fraction], available: Mapping[str, int], seq_len: int,
                   size: Any = None, n_sequences: int | None = None) -> dict[str, int]:
    """Sequences taken from each source (not yet checked against ``available``:
    :func:`sizing_problem`).

    Args:
        weights: :func:`normalize_weights` of the mixture weights.
        available: sequences each source's tokenize step packed (``meta.json`` ``n_sequences``).
        seq_len: tokens per sequence.
        size: ``mixture.size`` (model or dict; None: ``smallest_source``).
        n_sequences: ``mixture.n_sequences`` (only with ``smallest_source``).
    """
    total = requested_total(size, n_sequences, seq_len)
    if total is None:
        total = largest_feasible_total(weights, available)
    return largest_remainder_counts(weights, total)


def max_taken(available: int, size: Any = None) -> int:
    """The most sequences a source with ``available`` sequences may give: all of them once, or
    ``floor(max_epochs * available)`` for ``token_budget`` (exact: ``max_epochs`` read as its decimal)."""
    size = _size(size)
    if size["mode"] != "token_budget":
        return available
    return math.floor(Fraction(repr(float(size["max_epochs"]))) * available)


def epochs(taken: int, available: int) -> float:
    """Passes over a source: ``taken / available`` (0 for nothing taken from nothing)."""
    if available:
        return taken / available
    return 0.0 if not taken else math.inf


def _epochs_up(taken: int, available: int) -> str:
    """``taken / available`` rounded *up* to 2 decimals (so "raise it to X" is enough)."""
    return "inf" if available == 0 else f"{-(-taken * 100 // available) / 100:.2f}"


def sizing_problem(counts: Mapping[str, int], available: Mapping[str, int], seq_len: int,
                   size: Any = None, weights: Mapping[str, Fraction] | None = None) -> str | None:
    """Why ``counts`` cannot be taken from ``available``, as the text of one ``error:`` line naming
    the recipe field (``mixture.size`` / ``mixture.n_sequences``), each short source, what it has and
    what it would need (sequences, tokens, epochs); None when they fit."""
    size = _size(size)
    total = sum(counts.values())
    if total < 1:
        return f"empty mixture (available sequences {dict(available)})"
    short = [src for src in counts if counts[src] > max_taken(available[src], size)]
    if not short:
        return None
    if size["mode"] != "token_budget":
        detail = ", ".join(f"{src}: {counts[src]} > {available[src]}" for src in short)
        return (f"mixture.n_sequences: {total} needs more sequences than available ({detail}); lower "
                "n_sequences, change the weights or add data (sequences are never repeated; mixture.size "
                "{mode: token_budget, tokens: N, max_epochs: E} up-samples)")
    parts = []
    for src in short:
        share = f"its share {float(weights[src]):.4g}" if weights else "its share"
        parts.append(
            f"source {src} has {available[src]:,} sequences ({available[src] * seq_len:,} tokens), {share} of "
            f"{size['tokens']:,} tokens needs {counts[src]:,} ({counts[src] * seq_len:,} tokens) = "
            f"{_epochs_up(counts[src], available[src])} epochs > max_epochs {size['max_epochs']:g}")
    return (f"mixture.size: {'; '.join(parts)}; raise mixture.size.max_epochs, lower mixture.size.tokens or "
            f"the weight of {', '.join(short)}, or add data")


def size_mixture(weights: Mapping[str, Fraction], available: Mapping[str, int], seq_len: int,
                 size: Any = None, n_sequences: int | None = None) -> dict[str, int]:
    """:func:`mixture_counts`, checked: what the mix step takes from each source.

    Raises:
        MixtureError: an empty mixture, or a source that cannot give its count
            (:func:`sizing_problem`'s text).
    """
    counts = mixture_counts(weights, available, seq_len, size, n_sequences)
    problem = sizing_problem(counts, available, seq_len, size, weights)
    if problem:
        raise MixtureError(problem)
    return counts


@dataclass(frozen=True)
class MixtureTable:
    """The mixture as ``tidal plan``, the mix step's log and ``tidal report`` show it.

    ``available`` / ``taken`` are sequences per source (None: not known yet, i.e. the tokenize
    step has not run); ``problem`` is :func:`sizing_problem`'s text when the sizes do not fit.
    """

    weights: dict[str, float]
    seq_len: int
    size: dict[str, Any]
    n_sequences: int | None
    available: dict[str, int | None]
    taken: dict[str, int | None]
    problem: str | None = None

    def rows(self) -> list[dict[str, Any]]:
        """One dict per source (sorted): ``source``, ``weight``, ``tokens_available``,
        ``tokens_taken``, ``epochs``, ``tokens_unused`` (tokens never taken: 0 once a source is
        used whole); a value is None where it is not known yet."""
        out = []
        for src in sorted(self.weights):
            have, take = self.available.get(src), self.taken.get(src)
            out.append({
                "source": src, "weight": self.weights[src],
                "tokens_available": None if have is None else have * self.seq_len,
                "tokens_taken": None if take is None else take * self.seq_len,
                "epochs": None if have is None or take is None else epochs(take, have),
                "tokens_unused": None if have is None or take is None else max(have - take, 0) * self.seq_len,
            })
        return out

    def unused_fraction(self) -> float | None:
        """Tokens the mixture leaves unused over the training sources' tokens (None if unknown)."""
        rows = self.rows()
        if any(r["tokens_unused"] is None for r in rows):
            return None
        have = sum(r["tokens_available"] for r in rows)
        return sum(r["tokens_unused"] for r in rows) / have if have else 0.0

    def lines(self) -> list[str]:
        """The table as text lines (a header naming the mode, one line per source, a total)."""
        size = self.size
        if size["mode"] == "token_budget":
            head = (f"mixture: token_budget {size['tokens']:,} tokens ({requested_total(size, None, self.seq_len):,} "
                    f"sequences of {self.seq_len}), each source up-sampled to at most {size['max_epochs']:g} epochs")
        elif self.n_sequences is not None:
            head = (f"mixture: smallest_source, n_sequences {self.n_sequences:,} (sequences of {self.seq_len}, "
                    "never repeated)")
        else:
            head = (f"mixture: smallest_source (the largest mixture that repeats no sequence: the source with the "
                    f"fewest tokens for its weight sets the size; sequences of {self.seq_len})")
        rows = self.rows()
        unknown = "unknown"

        def num(value: Any) -> str:
            return unknown if value is None else f"{value:,}"

        cells = [("source", "weight", "tokens available", "tokens taken", "epochs", "tokens unused")]
        for r in rows:  # epochs rounded up, as the error line shows them: 2.004 is "2.01", not "2.00"
            epochs = "-" if r["epochs"] is None else _epochs_up(self.taken[r["source"]], self.available[r["source"]])
            cells.append((r["source"], f"{r['weight']:.4g}", num(r["tokens_available"]), num(r["tokens_taken"]),
                          epochs, num(r["tokens_unused"])))
        totals = [sum(r[k] for r in rows) if all(r[k] is not None for r in rows) else None
                  for k in ("tokens_available", "tokens_taken", "tokens_unused")]
        fraction = self.unused_fraction()
        share = "" if fraction is None else f" ({100 * fraction:.1f} %)"
        cells.append(("total", "1", num(totals[0]), num(totals[1]), "", num(totals[2]) + share))
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        lines = [head]
        for row in cells:
            lines.append("  " + "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
        if any(v is None for v in self.available.values()):
            lines.append("  unknown: until the source's tokenize step is committed (its meta.json gives the "
                         "tokens; tidal does not estimate them before)")
        return lines


def plan_table(weights: Mapping[str, float], seq_len: int, size: Any, n_sequences: int | None,
               available: Mapping[str, int | None]) -> MixtureTable:
    """The :class:`MixtureTable` of a mixture config and what is known of its sources.

    Args:
        weights: the mixture weights (normalized here exactly, :func:`normalize_weights`).
        available: sequences per source, None for a source not tokenized yet.

    Counts are the ones the mix step will take (:func:`mixture_counts`, same arithmetic). Without
    every source's size, only a ``token_budget`` (or a fixed ``n_sequences``) gives counts.
    """
    exact = normalize_weights(weights)
    size = _size(size)
    known = all(available.get(src) is not None for src in exact)
    if known:
        have = {src: int(available[src]) for src in exact}
        counts = mixture_counts(exact, have, seq_len, size, n_sequences)
        problem = sizing_problem(counts, have, seq_len, size, exact)
    else:
        total = requested_total(size, n_sequences, seq_len)
        counts = None if total is None else largest_remainder_counts(exact, total)
        problem = None
    return MixtureTable(
        weights={src: float(w) for src, w in exact.items()}, seq_len=seq_len, size=size, n_sequences=n_sequences,
        available={src: available.get(src) for src in exact},
        taken={src: None if counts is None else counts[src] for src in exact}, problem=problem)
