"""Shared fixtures: paths of the repo and the tiny recipe."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

from tests.tiers import FIRST_GROUPS, TIERS, group_of, tier_of

pytest_plugins = ["tests.cluster.kube_fixtures"]  # kube, installed: the Kubernetes API server tests

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "recipes" / "tiny.yaml"

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# every `mlflow server` a test starts: no huey job-runner processes beside it (MLflow's GenAI jobs; tidal
# runs none), which polled for work through the whole suite (about 120 CPU s of a CI run)
os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")


def pytest_itemcollected(item):
    """Mark every test with its tier (tests/tiers.py) as it is collected."""
    item.add_marker(getattr(pytest.mark, tier_of(item.path)))


def pytest_collection_modifyitems(config, items):
    """Run the longest groups first (the two halves of the cluster tier, then the operations server), one
    per worker, so that neither worker is the last to end; file order is kept within a group (a stable sort)."""
    first = {group: rank for rank, group in enumerate(FIRST_GROUPS)}
    items.sort(key=lambda item: first.get(group_of(item.path), len(first)))


# seconds of setup + call + teardown per xdist group and per worker, summed on the controller
_GROUP_SECONDS: defaultdict[str, float] = defaultdict(float)
_WORKER_SECONDS: defaultdict[str, float] = defaultdict(float)


_FILE_SECONDS: defaultdict[str, float] = defaultdict(float)
# CPU seconds per file: the worker's own and those of the processes it started and waited for (nodes, trainers,
# `tidal run`s, servers stopped at a fixture's teardown). On 2 cores the suite is CPU-bound, so these, not the
# wall seconds above (inflated by whatever else ran at the time), say what a test costs.
_FILE_CPU: defaultdict[str, float] = defaultdict(float)
CPU_KEY = "tidal_cpu_s"


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._tidal_cpu_mark = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the CPU seconds of each phase (setup, call, teardown) to its report; xdist carries them to the
    controller in ``user_properties``."""
    outcome = yield
    now = _cpu_seconds()
    mark = getattr(item, "_tidal_cpu_mark", now)
    item._tidal_cpu_mark = now
    outcome.get_result().user_properties.append((CPU_KEY, now - mark))


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _GROUP_SECONDS[group_of(REPO / path)] += report.duration
    _FILE_SECONDS[path] += report.duration
    _FILE_CPU[path] += sum(v for k, v in report.user_properties if k == CPU_KEY)
    gateway = getattr(getattr(report, "node", None), "gateway", None)  # xdist's WorkerController
    _WORKER_SECONDS[getattr(gateway, "id", "main")] += report.duration


def pytest_terminal_summary(terminalreporter):
    """Where the suite's time went: each worker's busy seconds and the 10 longest groups (tests/tiers.py), so
    that a group growing past half the suite's 30-minute budget is seen before it makes CI late."""
    if not _GROUP_SECONDS:
        return
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", "busy seconds per worker, and per xdist group (the 10 longest)")
    write("  ".join(f"{worker}={seconds:.0f}s" for worker, seconds in sorted(_WORKER_SECONDS.items())))
    for group, seconds in sorted(_GROUP_SECONDS.items(), key=lambda kv: -kv[1])[:10]:
        write(f"{seconds:8.0f}s  {group}")
    shared = sorted(((s, f) for f, s in _FILE_SECONDS.items() if group_of(REPO / f) in FIRST_GROUPS), reverse=True)
    write("the files of the shared groups: " + ", ".join(f"{f.removeprefix('tests/')} {s:.0f}s" for s, f in shared))
    if _FILE_CPU:
        heavy = sorted(((s, f) for f, s in _FILE_CPU.items()), reverse=True)[:30]
        total = sum(_FILE_CPU.values())
        terminalreporter.write_sep("=", f"CPU seconds per file, with the processes it waited for: {total:.0f} in all, "
                                   "the 30 heaviest")
        for seconds, path in heavy:
            write(f"{seconds:8.0f}s  {path.removeprefix('tests/')}")


def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadgroup``: each worker takes whole groups of tests/tiers.py (``group_of``), so a
    session fixture is started by one worker only. Why not ``xdist_group`` marks: xdist 3.8 applies them by
    rewriting ``item._nodeid``, which pytest 9.2 no longer reads (its node ids live in ``_id``), so the
    marks were silently ignored and the test cluster was started on both workers."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(REPO / nodeid.split("::", 1)[0])

    return TierGroups(config, log)


def pytest_configure(config):
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: a test of the {tier} tier (by folder, tests/tiers.py)")
    # One XLA compilation cache for the run: the controller makes it, its xdist workers and every process they
    # start inherit it (the test cluster's nodes do not: they get their image's env only). The suite trains
    # the same few tiny models in a hundred processes, and compiling them again was about a third of the
    # training tests' CPU (tests/train/test_divergence.py: 42.6 -> 26.8 CPU seconds on a cold cache). A
    # cached executable is the program XLA compiled, so no result changes: the cluster tests compare the
    # nodes' training (no cache) with a local run (this cache) bitwise.
    if "PYTEST_XDIST_WORKER" not in os.environ and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
        import tempfile

        config._tidal_xla_cache = tempfile.mkdtemp(prefix="tidal-xla-cache-")
        os.environ.update({"JAX_COMPILATION_CACHE_DIR": config._tidal_xla_cache,  # every compile, however small
                           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})


def pytest_unconfigure(config):
    cache = getattr(config, "_tidal_xla_cache", None)
    if cache:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)


@pytest.fixture
def tiny_data() -> dict:
    """The tiny recipe as a plain dict (edit it to build variants)."""
    import yaml

    return yaml.safe_load(TINY.read_text())


def seal(out: Path) -> str:
    """Commit a step directory a test wrote by hand as a real commit would: ``manifest.json`` over its
    files, then ``_SUCCESS`` holding the root hash (steps check their inputs against both,
    tidal/core/inputs.py) and, with a signing key configured, ``step.json``'s signing record and
    ``signature.json``. Returns the root hash."""
    from tidal.integrity.hashing import write_manifest
    from tidal.integrity.signing import load_key, signing_record, write_signature

    out = Path(out)
    manifest = write_manifest(out, exclude=("step.json", "_SUCCESS", "signature.json"))
    (out / "_SUCCESS").write_text(manifest["root_hash"] + "\n")
    key = load_key()
    if key is not None:  # signed as a commit signs it: dependents then require it (tidal/core/inputs.py)
        record = out / "step.json"
        if not record.is_file():
            record.write_text(json.dumps({"step_id": out.name, "manifest_root_hash": manifest["root_hash"],
                                          "signing": signing_record(key)}))
        write_signature(out, key)
    return manifest["root_hash"]
