"""Every test file has a tier by its folder, and the files that share the test cluster or the API server
share an xdist group (tests/tiers.py), so that each worker starts them at most once."""

from __future__ import annotations

import ast

from tests.tiers import FILE_TIERS, FIRST_GROUPS, TESTS, TIERS, group_of, tier_of


def test_every_test_file_has_a_tier():
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 100
    assert {tier_of(f) for f in files} == set(TIERS)
    assert all((TESTS / rel).is_file() for rel in FILE_TIERS), "a FILE_TIERS entry names no file"


SESSION_FIXTURES = {"cluster", "kube", "installed", "slice_root"}  # tests/cluster/conftest.py, kube_fixtures.py


def test_every_file_using_the_cluster_or_the_api_server_is_in_a_group_that_starts_them_once():
    users = []
    for f in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(f.read_text())
        args = {a.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) for a in node.args.args}
        if args & SESSION_FIXTURES:
            users.append(f.relative_to(TESTS).as_posix())
            # a session fixture starts once per worker that runs a user of it: the test cluster is started
            # by the two cluster groups (one per worker), the API server by the kube group only
            want = {"kube"} if args & {"kube", "installed"} else {"cluster", "kube"}
            assert group_of(f) in want, f"{f} uses {sorted(args & SESSION_FIXTURES)} outside the groups {want}"
    assert "deploy/test_kube_server.py" in users and "cluster/test_share_nothing.py" in users
    assert group_of(TESTS / "deploy" / "test_node_pools.py") == group_of(TESTS / "deploy" / "test_kube_server.py")
    assert group_of(TESTS / "cluster" / "test_airflow_celery.py") == "kube"
    assert group_of(TESTS / "data" / "test_clean.py") != group_of(TESTS / "data" / "test_mix.py")
    assert FIRST_GROUPS[:2] == ("cluster", "kube")
