"""tests/reservations.py: a name is held by one live process, even when several ask at the same instant."""

from __future__ import annotations

import multiprocessing
import os

from tests.reservations import reserve


def _ask(directory, barrier, results):
    barrier.wait()
    results.put((os.getpid(), reserve(directory, "64")))


def test_processes_asking_together_get_the_name_once(tmp_path):
    ctx = multiprocessing.get_context("fork")
    for round_ in range(5):
        directory = tmp_path / str(round_)
        barrier, results = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=_ask, args=(directory, barrier, results)) for _ in range(8)]
        for proc in procs:
            proc.start()
        answers = [results.get(timeout=30) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        winners = [pid for pid, won in answers if won]
        assert len(winners) == 1, answers
        assert (directory / "64").read_text() == str(winners[0])


def test_a_dead_owners_name_is_taken_over_after_its_cleanup(tmp_path):
    proc = multiprocessing.get_context("fork").Process(target=reserve, args=(tmp_path, "7"))
    proc.start()
    proc.join()
    assert (tmp_path / "7").read_text() == str(proc.pid)
    cleaned = []
    assert reserve(tmp_path, "7", on_stale=lambda: cleaned.append(True))
    assert cleaned == [True]
    assert (tmp_path / "7").read_text() == str(os.getpid())
    assert not reserve(tmp_path, "7")  # held by a live process (this one)
