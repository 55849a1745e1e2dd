"""The on-call plugin's routes show a user only the recipes whose DAG they may read (issue 43, item 5: any
logged-in Airflow user saw every recipe's page, whatever their DAG permissions).

In process, no server: the real plugin app under FastAPI's TestClient, the auth manager Airflow builds from
``[core] auth_manager`` (``create_auth_manager``/``init_auth_manager``, as the API server does), JWTs it signs
for its configured users, and a temporary SQLite metadata DB (created from the ORM, as ``airflow db migrate``
does on an empty database: the tokens' revocation check, the readable DAG ids and the runs read it). The auth
manager is SimpleAuthManager with per-DAG grants for some users (:class:`PerDagAuthManager`), since
SimpleAuthManager's roles all read every DAG.
"""

from __future__ import annotations

import importlib.util
import secrets
import shutil
from datetime import UTC, datetime
from typing import ClassVar

import pytest
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

from operators.oncall import NONE_READABLE
from tests.conftest import REPO


class PerDagAuthManager(SimpleAuthManager):
    """SimpleAuthManager, except that the users of ``GRANTS`` may read (GET) only the DAGs listed for them."""

    GRANTS: ClassVar[dict[str, set[str]]] = {"alice": {"tidal_tiny"}, "bob": set()}

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        if user.get_name() in self.GRANTS:
            return method == "GET" and details is not None and details.id in self.GRANTS[user.get_name()]
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)


@pytest.fixture(scope="module")
def oncall(tmp_path_factory):
    """(TestClient of the plugin app, {user: JWT}) with three recipes: tiny, other (a copy of tiny named
    ``other``) and broken; DAGs tidal_tiny and tidal_other in the metadata DB, each with one failed run."""
    from airflow import settings
    from airflow.api_fastapi import app as api_app
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.db import initdb
    from airflow.utils.session import create_session
    from fastapi.testclient import TestClient

    tmp = tmp_path_factory.mktemp("oncall_access")
    recipes = tmp / "recipes"
    recipes.mkdir()
    shutil.copy(REPO / "recipes" / "tiny.yaml", recipes / "tiny.yaml")
    text = (REPO / "recipes" / "tiny.yaml").read_text()
    assert text.count("\nname: tiny\n") == 1
    (recipes / "other.yaml").write_text(text.replace("\nname: tiny\n", "\nname: other\n"))
    (recipes / "broken.yaml").write_text("name: broken\nsources: [\n")
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp}/airflow.db",
            "AIRFLOW__CORE__AUTH_MANAGER": f"{__name__}.PerDagAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,alice:viewer,bob:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(tmp / "passwords.json"),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "TIDAL_RECIPES_DIR": str(recipes),
            "TIDAL_STORAGE_ROOT": str(tmp / "root"),
        }.items():
            mp.setenv(key, value)
        settings.configure_vars()
        settings.reconfigure_orm()
        signer, validator = BaseAuthManager._get_token_signer, BaseAuthManager._get_token_validator
        signer.cache_clear(), validator.cache_clear()  # this module's JWT secret
        api_app.purge_cached_app()
        try:
            initdb()
            with create_session() as session:
                session.add(DagBundleModel(name="dags-folder"))
                session.flush()  # the DAGs' foreign key
                for dag_id in ("tidal_tiny", "tidal_other"):
                    session.add(DagModel(dag_id=dag_id, bundle_name="dags-folder", fileloc="/dags/pretrain.py"))
                    session.add(DagRun(dag_id=dag_id, run_id=f"run_of_{dag_id}", run_type="manual", state="failed",
                                       run_after=datetime.now(UTC)))
            manager = api_app.init_auth_manager()
            assert type(manager) is PerDagAuthManager
            tokens = {u.username: manager.generate_jwt(u) for u in manager.get_users()}
            spec = importlib.util.spec_from_file_location("tidal_oncall", REPO / "plugins" / "tidal_oncall.py")
            plugin = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(plugin)
            with TestClient(plugin.app) as client:
                yield client, tokens
        finally:
            api_app.purge_cached_app()
            signer.cache_clear(), validator.cache_clear()
    settings.configure_vars()
    settings.reconfigure_orm()


def _get(oncall, user: str, path: str):
    client, tokens = oncall
    response = client.get(path, headers={"Authorization": f"Bearer {tokens[user]}"})
    assert response.status_code == 200, response.text[:2000]
    return response


def test_a_user_sees_only_the_recipes_of_the_dags_they_may_read(oncall):
    status = _get(oncall, "alice", "/status").json()
    assert [r["dag_id"] for r in status["recipes"]] == ["tidal_tiny"]  # not other, not broken (a path and error)
    assert set(status["runs"]) == {"tidal_tiny"}  # other's runs never read
    page = _get(oncall, "alice", "/").text
    assert "run_of_tidal_tiny" in page and "tidal_other" not in page and "run_of_tidal_other" not in page
    assert "broken" not in page and NONE_READABLE not in page


def test_who_reads_every_dag_sees_every_recipe_and_the_broken_one(oncall):
    status = _get(oncall, "admin", "/status").json()
    assert [r.get("dag_id") for r in status["recipes"]] == [None, "tidal_other", "tidal_tiny"]  # broken.yaml first
    assert "broken.yaml" in status["recipes"][0]["path"] and status["recipes"][0]["error"]
    page = _get(oncall, "admin", "/").text
    assert "run_of_tidal_tiny" in page and "run_of_tidal_other" in page and "recipe does not load" in page


def test_a_user_who_reads_no_dag_is_told_so_in_one_line(oncall):
    status = _get(oncall, "bob", "/status").json()
    assert status == {"recipes": [], "runs": {}, "note": NONE_READABLE}
    page = _get(oncall, "bob", "/").text
    assert NONE_READABLE in page and "tidal_" not in page and "<h2" not in page


def test_recipes_the_user_may_not_read_are_not_loaded(oncall, monkeypatch):
    import operators.oncall

    loaded = []
    real = operators.oncall.recipe_status
    monkeypatch.setattr(operators.oncall, "recipe_status", lambda path: loaded.append(path.name) or real(path))
    _get(oncall, "alice", "/status")
    assert loaded == ["tiny.yaml"]
    _get(oncall, "bob", "/status")
    assert loaded == ["tiny.yaml"]


def test_no_token_no_page(oncall):
    client, _ = oncall
    assert client.get("/status").status_code == 401
    assert client.get("/status", headers={"Authorization": "Bearer not-a-jwt"}).status_code in (401, 403)
