"""The training watchdog: silent while steps come, armed only after the first one, and on a stall
one error line, every thread's stack and exit 76 within about its timeout; a bad setting is refused."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from tidal.settings import SettingsError, read
from tidal.train.watchdog import EXIT_STALLED, Watchdog

STALL = textwrap.dedent("""
    import sys, time, threading
    from tidal.train.watchdog import Watchdog

    def data_thread_blocked_forever():
        threading.Event().wait()

    threading.Thread(target=data_thread_blocked_forever, name="tidal-batch-ahead", daemon=True).start()
    with Watchdog(float(sys.argv[1])) as dog:
        time.sleep(2 * float(sys.argv[1]))  # compiling: not armed yet, so nothing happens
        for step in range(1, 4):
            dog.beat(step)
            time.sleep(0.05)
        print("steps done, now hanging", flush=True)
        time.sleep(60)  # the hang
    print("unreachable", flush=True)
""")


def test_a_stalled_loop_dumps_every_stack_and_exits_76():
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STALL, "1.0"], capture_output=True, text=True, timeout=60,
                          check=False)
    took = time.monotonic() - start
    assert proc.returncode == EXIT_STALLED, proc.stderr[-2000:]
    assert "steps done, now hanging" in proc.stdout and "unreachable" not in proc.stdout
    assert "tidal.train: error: no training step finished for" in proc.stderr and "after step 3" in proc.stderr
    assert "data_thread_blocked_forever" in proc.stderr  # every thread's stack, the blocked one too
    assert took < 20, took  # 2 s unarmed + ~1 s stall + interpreter start; not the 60 s sleep


def test_steps_that_keep_coming_never_trip_it():
    with Watchdog(0.3) as dog:
        for step in range(1, 30):
            dog.beat(step)
            time.sleep(0.02)
    with Watchdog(None) as off:  # unset: no thread at all
        assert off._thread is None


def test_the_setting_is_checked(monkeypatch):
    monkeypatch.setenv("TIDAL_TRAIN_WATCHDOG_S", "-3")
    with pytest.raises(SettingsError, match="TIDAL_TRAIN_WATCHDOG_S"):
        read()
    monkeypatch.setenv("TIDAL_TRAIN_WATCHDOG_S", "600")
    assert read().train_watchdog_s == 600
    with pytest.raises(ValueError, match="> 0"):
        Watchdog(0)
