"""The failure catalog: stable fingerprints, no lost records under concurrency, `tidal failures`."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tidal.storage import LocalStorage

VENV_BIN = Path(sys.executable).parent


def _raise_in(path: str, lineno: int, message: str) -> BaseException:
    """Raise ``ValueError(message)`` from a function compiled as if it lived at ``path:lineno``."""
    code = "\n" * (lineno - 1) + "def failing_step(msg):\n    raise ValueError(msg)\n"
    namespace: dict = {}
    exec(compile(code, path, "exec"), namespace)  # noqa: S102 - builds a traceback with a chosen file/line
    try:
        namespace["failing_step"](message)
    except ValueError as err:
        return err
    raise AssertionError("did not raise")


def test_fingerprint_ignores_line_numbers_paths_and_messages_but_not_the_code_path():
    from tidal.tracking.failures import build_record

    a = build_record(_raise_in("/home/a/venv/lib/python3.11/site-packages/lib/mod.py", 10, "size 1 at 0x7f00"))
    b = build_record(_raise_in("/opt/other/lib/python3.12/site-packages/lib/mod.py", 99, "size 2 at 0x7f11"))
    c = build_record(_raise_in("/srv/x/tidal/quality/gates.py", 10, "boom"))
    d = build_record(_raise_in("/home/y/checkout/tidal/quality/gates.py", 50, "other"))
    e = build_record(_raise_in("/srv/x/tidal/mix.py", 10, "boom"))
    assert a["fingerprint"] == b["fingerprint"]
    assert c["fingerprint"] == d["fingerprint"]
    assert len({a["fingerprint"], c["fingerprint"], e["fingerprint"]}) == 3
    assert a["frames"][-1] == "lib/mod.py:failing_step" and c["frames"][-1] == "tidal/quality/gates.py:failing_step"
    assert a["message"] == "size 1 at 0x7f00" and a["exception_type"] == "ValueError"


def _writer(args: tuple[str, int, int]) -> int:
    root, worker, n = args
    from tidal.tracking.failures import build_record, record_failure

    for i in range(n):
        err = _raise_in("/x/tidal/stats.py" if i % 2 else "/x/tidal/train.py", 5, f"w{worker} i{i}")
        task = "stats" if i % 2 else "train"
        record_failure(LocalStorage(Path(root)), build_record(err, dag_id="tidal_x", task_id=task, recipe="x",
                                                              try_number=i))
    return n


def test_concurrent_writers_lose_nothing_and_groups_count(tmp_path):
    from tidal.tracking.failures import group_failures, list_failures

    with multiprocessing.get_context("spawn").Pool(4) as pool:
        written = sum(pool.map(_writer, [(str(tmp_path), w, 25) for w in range(4)]))
    records = list_failures(LocalStorage(tmp_path))
    assert len(records) == written == 100
    assert [r["time"] for r in records] == sorted((r["time"] for r in records), reverse=True)
    groups = group_failures(records)
    assert sorted(g["count"] for g in groups) == [4 * 12, 4 * 13]  # odd i: stats, even i: train
    assert {tuple(g["tasks"]) for g in groups} == {("tidal_x.stats",), ("tidal_x.train",)}
    assert not list(tmp_path.glob("failures/*/.*.tmp"))


def test_a_gate_failure_keeps_its_failed_expectations(tmp_path):
    from tidal.quality.gates import GateFailed, summarize
    from tidal.tracking.failures import (
        build_record,
        format_groups,
        group_failures,
        list_failures,
        record_failure,
    )

    results = [
        {"expectation": "expect_column_values_to_be_between", "source": "all", "column": "total_tokens",
         "observed": 1234.0, "expected": ">= 1e+12", "min": 1e12, "max": None, "success": False},
        {"expectation": "expect_column_values_to_be_between", "source": "all", "column": "quarantine_rate",
         "observed": 0.0, "expected": "<= 0.05", "min": None, "max": 0.05, "success": True},
    ]
    try:
        raise GateFailed(summarize(results), {"success": False, "results": results, "summary": summarize(results)})
    except GateFailed as err:
        record = build_record(err, dag_id="tidal_x", task_id="gate", recipe="x", step_id="gate-abc", try_number=1)
    assert [c["column"] for c in record["failed_expectations"]] == ["total_tokens"]
    record_failure(LocalStorage(tmp_path), record)
    text = format_groups(group_failures(list_failures(LocalStorage(tmp_path))))
    assert "GateFailed" in text and "total_tokens [source=all]: expected >= 1e+12, got 1234" in text


def test_tidal_failures_lists_newest_first_with_counts(tmp_path):
    from tidal.tracking.failures import build_record, record_failure

    for i in range(3):
        record_failure(LocalStorage(tmp_path), build_record(
            _raise_in("/x/tidal/train.py", 1, f"old {i}"), dag_id="tidal_x", task_id="train", recipe="x",
            time=f"2026-01-01T00:00:0{i}.000+00:00"))
    record_failure(LocalStorage(tmp_path), build_record(_raise_in("/x/tidal/stats.py", 1, "newest"), dag_id="tidal_x",
                                                        task_id="stats", recipe="x",
                                                        time="2026-02-01T00:00:00.000+00:00"))
    out = subprocess.run([str(VENV_BIN / "tidal"), "failures", "--storage-root", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    blocks = [line for line in out.splitlines() if not line.startswith(" ")]
    assert blocks[0].endswith("4 failure(s)")
    assert "  1 failure(s)" in blocks[1] and "2026-02-01" in blocks[1]
    assert "  3 failure(s)" in blocks[2] and "2026-01-01T00:00:02" in blocks[2]
    assert "message: newest" in out and "tidal_x.train x3" in out
    as_json = json.loads(subprocess.run([str(VENV_BIN / "tidal"), "failures", "--storage-root", str(tmp_path),
                                         "--json"], cwd=REPO, capture_output=True, text=True, timeout=120,
                                        check=True).stdout)
    assert next(r["message"] for r in as_json) == "newest" and len(as_json) == 4


def test_a_failure_whose_step_committed_since_is_marked_resolved_and_kept(tmp_path):
    """The catalog is history: a failure stays, marked resolved once its step is committed; the
    on-call page shows the mark and never makes a ``runs:/`` URI a link a browser cannot open."""
    from operators.oncall import render_page
    from tidal.tracking.failures import build_record, format_groups, group_failures, list_failures, record_failure

    storage = LocalStorage(tmp_path)
    for step_id, path in (("stats-aaa", "/x/tidal/stats.py"), ("train-bbb", "/x/tidal/train.py")):
        record_failure(storage, build_record(_raise_in(path, 3, "boom"), dag_id="tidal_x", task_id=step_id[:5],
                                             recipe="x", step_id=step_id, try_number=1,
                                             mlflow_link="runs:/0123abcd"))
    committed = {"stats-aaa"}
    groups = group_failures(list_failures(storage), lambda step_id: step_id in committed)
    assert {g["latest"]["step_id"]: g["resolved"] for g in groups} == {"stats-aaa": True, "train-bbb": False}
    assert len(list_failures(storage)) == 2
    assert [g["resolved"] for g in group_failures(list_failures(storage))] == [None, None]  # not asked
    text = format_groups(groups)
    assert text.count("RESOLVED") == 1
    status = {"recipe": "x", "dag_id": "tidal_x", "schedule": None, "recipe_hash": "0" * 64, "steps": [],
              "failing_gates": [], "failures": groups, "checkpoint": None,
              "mlflow": {"uri": "sqlite:///x", "link": None}}
    page = render_page([status], {"tidal_x": [{"run_id": "r1", "run_type": "manual", "state": "failed", "start": 1,
                                               "end": 2, "failed_tasks": ["stats"], "upstream_failed": ["gate"],
                                               "progress": {"planned": 3, "committed": 1, "missing": ["gate", "train"],
                                                            "overrides": {"train.steps": 6}}}]})
    assert page.count("resolved: step committed since") == 1
    assert "href='runs:/" not in page and "<code>runs:/0123abcd</code>" in page
    assert "<td>stats</td><td>gate</td>" in page and "1/3 (missing gate, train); train.steps=6" in page
