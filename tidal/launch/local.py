"""Run the training entrypoint ``python -m tidal.train STEP_DIR`` as a local subprocess.

The command and arguments are exactly those a Kubernetes pod runs; only the place differs.
Output lines are streamed to a logger as they come; on a non-zero exit the last lines are
kept in the raised :class:`TrainingFailed`.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tidal.settings import current

TAIL_LINES = 40
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _load_prctl():
    """libc's ``prctl``, resolved in the parent: the child may not import or take locks."""
    if sys.platform != "linux":
        return None
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


_PRCTL = _load_prctl()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: deliver SIGTERM to the trainer if its launcher dies (even by SIGKILL).

    Without it a killed launcher leaves an orphan trainer writing into a step directory that
    the rerun is about to resume in. SIGTERM lets the trainer stop like a preempted pod.
    Only a plain C call happens here (no imports, no locks), so it is safe after fork.
    """
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


class TrainingFailed(RuntimeError):
    """The training entrypoint exited non-zero.

    Attributes:
        step_dir: the step directory it ran on.
        exit_code: the process exit status (negative: killed by that signal).
        tail: its last output lines (stdout and stderr interleaved), at most ``TAIL_LINES``.
    """

    def __init__(self, step_dir: Path, exit_code: int, tail: list[str]):
        self.step_dir, self.exit_code, self.tail = step_dir, exit_code, tail
        super().__init__(f"training in {step_dir} failed with exit code {exit_code}; last output:\n"
                         + "\n".join(tail))


def entrypoint_command(step_dir: str | Path, extra_args: Sequence[str] = ()) -> list[str]:
    """The argv of the training entrypoint for ``step_dir`` (same in a pod)."""
    return [sys.executable, "-m", "tidal.train", str(step_dir), *extra_args]


def run_entrypoint(step_dir: str | Path, *, log: logging.Logger | None = None,
                   extra_args: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
    """Run the entrypoint to completion, logging each output line at INFO.

    Args:
        step_dir: directory holding ``spec.json``; outputs are written there.
        extra_args: appended to the command (e.g. ``["--stop-after", "5"]`` in tests).
        env: extra environment variables on top of this process's environment.

    Raises:
        TrainingFailed: non-zero exit, with the exit code and the last output lines.
    """
    log = log or logging.getLogger("tidal.train")
    step_dir = Path(step_dir)

    # The settings this process runs under go to the child explicitly (tidal/settings.py), on top
    # of the inherited environment (JAX, AWS, PATH ...), then the caller's extra variables.
    full_env = {**os.environ, **current().child_env(), "PYTHONUNBUFFERED": "1", **(env or {})}
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(entrypoint_command(step_dir, extra_args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, env=full_env,
                            preexec_fn=_die_with_parent if _PRCTL else None)  # noqa: PLW1509 - C call only
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            log.info("%s", line)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0:
        raise TrainingFailed(step_dir, code, list(tail))
