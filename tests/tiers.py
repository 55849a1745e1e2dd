"""Test tiers, by folder: every test gets exactly one of the markers ``unit``, ``integration``,
``cluster`` or ``e2e`` from where its file lives, and a group (``group_of``) that keeps together, on one
pytest-xdist worker, the tests that share an expensive session fixture (tests/conftest.py's scheduler).

Why by folder: a newcomer knows a test's tier from its path, and a new test file needs no marker
to land in the right tier. The tiers:

* ``unit``: in one process (Beam's in-process runner, JAX on CPU, temporary folders); no server.
  ``make test-fast`` runs this tier for the edit loop (minutes).
* ``integration``: one real server or tool per test module or session (an S3 server, MLflow,
  Helm, Airflow's ``dags test``, a trainer subprocess).
* ``cluster``: the share-nothing test cluster (tests/cluster) and the Kubernetes API server.
* ``e2e``: whole DAGs through Airflow (``airflow dags test``, ``airflow standalone``).

Why the groups: under pytest-xdist (``-n 3 --dist loadgroup``) each worker is its own pytest session, so
a session fixture used on two workers starts twice. The cluster tier is two groups, one per worker, each
starting its own test cluster (each cluster has its own /16, bridge, database and cgroups, so two fit on
one machine): ``cluster`` holds the data and training scenarios (Flink, share-nothing, node loss);
``kube`` the files that need the Kubernetes API server (the chart's deploy tests, the Celery workers'
Airflow, GKE launches, pod limits), which start one API server. Together they were one 30-minute long
pole; apart, each takes about 20 minutes of a worker while a third runs the rest. The operations tests
share one ``airflow standalone``; every other file is a group of its own, so its module fixtures are
built once.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "cluster", "e2e")

# tests/<folder>/ -> tier; a file in FILE_TIERS overrides its folder's tier. Top-level files are unit.
FOLDER_TIERS: dict[str, str] = {
    "unit": "unit",
    "audit": "unit",
    "core": "unit",
    "data": "unit",
    "eval": "unit",
    "files": "unit",
    "integrity": "unit",
    "launch": "unit",
    "quality": "unit",
    "recipe": "unit",
    "scaling": "unit",
    "train": "unit",
    "deploy": "integration",
    "operators": "integration",
    "storage": "integration",
    "tracking": "integration",
    "ops": "e2e",
    "cluster": "cluster",
    "e2e": "e2e",
}
FILE_TIERS: dict[str, str] = {
    # files of unit folders that start trainers, jobs or whole `tidal run`s in subprocesses, or an S3 server
    "audit/test_run_ids.py": "integration",
    "data/test_neardup_memory.py": "integration",
    "data/test_own_data.py": "integration",
    "data/test_workers_write_to_bucket.py": "integration",
    "eval/test_checkpoint_evals.py": "integration",
    "train/test_continue.py": "integration",
    "train/test_distributed.py": "integration",
    "train/test_divergence.py": "integration",
    "train/test_export_sample.py": "integration",
    "train/test_preemption.py": "integration",
    "train/test_train_e2e.py": "integration",
    "train/test_sharded_checkpoints.py": "integration",
    "train/test_sizing.py": "integration",  # the sizer's process with libtpu
    # the Kubernetes API server (tests/cluster/kube.py) and the chart installed on it
    "deploy/test_kube_server.py": "cluster",
    "deploy/test_node_pools.py": "cluster",
    "deploy/test_pod_failures.py": "cluster",
}
# tiers whose files share one worker: the fixture they share starts once per session
SHARED_GROUPS: dict[str, str] = {"cluster": "cluster"}
FOLDER_GROUPS: dict[str, str] = {"ops": "ops"}  # one `airflow standalone` (tests/ops/conftest.py)
# The API server's users: one API server (and a second test cluster) on the other worker than ``cluster``.
FILE_GROUPS: dict[str, str] = {
    f"{folder}/test_{name}.py": "kube" for folder, names in (
        ("deploy", ("kube_server", "node_pools", "pod_failures")),
        ("cluster", ("airflow_celery", "gke_on_kube", "pod_limits")))
    for name in names
}
# the groups that start first, one per worker (tests/conftest.py), so that none is the last to end
FIRST_GROUPS = ("cluster", "kube", "ops")


def tier_of(path: Path) -> str:
    """The tier of the test file at ``path`` (under tests/).

    Raises:
        ValueError: the file's folder has no tier (add it to ``FOLDER_TIERS``).
    """
    rel = path.resolve().relative_to(TESTS).as_posix()
    if rel in FILE_TIERS:
        return FILE_TIERS[rel]
    folder, _, rest = rel.partition("/")
    if not rest:
        return "unit"
    try:
        return FOLDER_TIERS[folder]
    except KeyError:
        raise ValueError(f"tests/{folder}/ has no test tier: add it to FOLDER_TIERS in tests/tiers.py "
                         f"(one of {', '.join(TIERS)})") from None


def group_of(path: Path) -> str:
    """The xdist group of the test file at ``path``: its tier's or folder's shared group, else the file."""
    rel = path.resolve().relative_to(TESTS).as_posix()
    tier = tier_of(path)
    if rel in FILE_GROUPS:
        return FILE_GROUPS[rel]
    if tier in SHARED_GROUPS:
        return SHARED_GROUPS[tier]
    folder = rel.partition("/")[0]
    return FOLDER_GROUPS.get(folder, rel)
