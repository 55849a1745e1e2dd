"""Local launcher: the entrypoint runs as a subprocess; failures carry exit code and output tail."""

from __future__ import annotations

import logging
import sys

import pytest

from tidal.launch.local import TAIL_LINES, TrainingFailed, entrypoint_command, run_entrypoint


def test_command_is_the_pod_entrypoint(tmp_path):
    assert entrypoint_command(tmp_path) == [sys.executable, "-m", "tidal.train", str(tmp_path)]


def test_failure_carries_exit_code_and_tail(tmp_path, caplog):
    log = logging.getLogger("test.launch")
    with caplog.at_level(logging.INFO, logger="test.launch"), pytest.raises(TrainingFailed) as info:
        run_entrypoint(tmp_path, log=log)  # no spec.json: a clear config error, exit code 2
    err = info.value
    assert err.exit_code == 2 and err.step_dir == tmp_path
    assert 0 < len(err.tail) <= TAIL_LINES
    assert "spec.json: cannot read the step spec" in err.tail[-1]
    assert "cannot read the step spec" in caplog.text  # output streamed to the logger
    assert "exit code 2" in str(err)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux-only")
def test_trainer_dies_when_its_launcher_is_killed():
    """SIGKILL of the launcher must not leave an orphan trainer writing into the step dir."""
    import os
    import signal
    import subprocess
    import time

    launcher = subprocess.Popen(
        [sys.executable, "-c",
         ("import subprocess, sys\n"
          "from tidal.launch.local import _die_with_parent\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
          "preexec_fn=_die_with_parent)\n"
          "print(child.pid, flush=True)\n"
          "child.wait()\n")],
        stdout=subprocess.PIPE, text=True,
    )
    child_pid = int(launcher.stdout.readline())
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child_pid, signal.SIGKILL)
    pytest.fail("the child outlived its killed launcher")
