"""A ``jax.profiler`` trace of chosen training steps, saved with the step and logged to MLflow.

``TIDAL_TRAIN_PROFILE_STEPS=FIRST:LAST`` (1-based, inclusive; :class:`tidal.settings.Settings`)
traces steps FIRST..LAST of the run into ``profile_trace/`` in the step directory (``.xplane.pb``
and ``.trace.json.gz``: TensorBoard's profile plugin, Perfetto or ``chrome://tracing`` open them),
which the commit logs to the step's MLflow run as an artifact folder. Steps before the resumed
checkpoint are not run, so not traced. An operational setting: it does not change the step id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TRACE_DIR = "profile_trace"


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """``"10:12"`` -> ``(10, 12)``; None or empty -> None.

    Raises:
        ValueError: not ``FIRST:LAST`` with 1 <= FIRST <= LAST (names the rule).
    """
    if not text:
        return None
    first, sep, last = text.partition(":")
    try:
        span = (int(first), int(last or first))
    except ValueError:
        span = (0, 0)
    if (sep and not last) or not 1 <= span[0] <= span[1]:
        raise ValueError(f"TIDAL_TRAIN_PROFILE_STEPS={text!r}: expected FIRST:LAST with 1 <= FIRST <= LAST, e.g. 10:12")
    return span


class StepTrace:
    """Starts the trace before step ``first`` and stops it after step ``last`` (1-based)."""

    def __init__(self, span: tuple[int, int] | None, step_dir: Path):
        self.span, self.out = span, Path(step_dir) / TRACE_DIR
        self.active = False

    def before(self, step: int) -> None:
        """Call before running 1-based ``step``."""
        if self.span is not None and step == self.span[0] and not self.active:
            import jax

            self.out.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.out))
            self.active = True

    def after(self, step: int, result: Any) -> None:
        """Call after 1-based ``step`` (``result``: its outputs, waited for before the trace stops)."""
        if self.active and self.span is not None and step >= self.span[1]:
            self.stop(result)

    def stop(self, result: Any = None) -> None:
        """Stop an active trace (also when the loop ends early)."""
        if not self.active:
            return
        import jax

        if result is not None:
            jax.block_until_ready(result)
        jax.profiler.stop_trace()
        self.active = False
        print(f"profiler trace of steps {self.span[0]}..{self.span[1]} in {self.out}", flush=True)


__all__ = ["TRACE_DIR", "StepTrace", "parse_steps"]
