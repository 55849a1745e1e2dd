"""Init container of the MLflow server (templates/mlflow.yaml): basic-auth config and the clients' user.

MLflow's basic-auth app reads one ini file (MLFLOW_AUTH_CONFIG_PATH) and takes the auth
database URI only from it, while that URI holds a password. So this script writes the file
at start-up, onto an in-memory emptyDir the server container mounts: the chart's settings
(MLFLOW_AUTH_CONFIG_TEMPLATE, a ConfigMap: default_permission, ...) plus ``database_uri``
from the Secret (MLFLOW_AUTH_DATABASE_URI). Then it makes sure the user the clients (Airflow
pods, training pods) log in as exists, is no admin and has the Secret's password
(MLFLOW_AUTH_CLIENT_USERNAME / MLFLOW_AUTH_CLIENT_PASSWORD): created on the first start,
its password updated when the Secret's changed. The admin user is the server's own
bootstrap (MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD).
"""

from __future__ import annotations

import configparser
import os
import sys


def write_config(template: str, target: str, database_uri: str) -> None:
    """``template`` plus ``database_uri``, written to ``target`` (mode 0600)."""
    config = configparser.ConfigParser(interpolation=None)
    with open(template, encoding="utf-8") as f:
        config.read_file(f)
    if config.has_option("mlflow", "database_uri") or config.has_option("mlflow", "admin_password"):
        raise SystemExit(f"{template}: database_uri and admin_password come from the Secret, not the ConfigMap")
    # MLflow reads the file with configparser's default interpolation, where % starts a
    # reference: a URL-encoded password (%40 for @) must be written as %%40.
    config["mlflow"]["database_uri"] = database_uri.replace("%", "%%")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        config.write(f)


def ensure_client_user(database_uri: str, username: str, password: str, admin_username: str) -> str:
    """Create or update the clients' non-admin user; returns what was done."""
    if username == admin_username:
        raise SystemExit(f"the clients' user {username!r} is the admin user: give the clients a user of their own")
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore()
    store.init_db(database_uri)  # creates or migrates the auth tables, as the server would
    if not store.has_user(username, use_primary=True):
        try:
            store.create_user(username, password, is_admin=False)
            return "created"
        except MlflowException:
            if not store.has_user(username, use_primary=True):  # not a concurrent replica's create
                raise
    if store.get_user(username).is_admin:
        raise SystemExit(f"the clients' user {username!r} is an MLflow admin: revoke that (update-user-admin) "
                         "or name another user in the Secret")
    if store.authenticate_user(username, password, use_primary=True):
        return "unchanged"
    store.update_user(username, password=password)
    return "password updated"


def main() -> None:
    env = os.environ
    database_uri = env["MLFLOW_AUTH_DATABASE_URI"]
    write_config(env["MLFLOW_AUTH_CONFIG_TEMPLATE"], env["MLFLOW_AUTH_CONFIG_PATH"], database_uri)
    username = env["MLFLOW_AUTH_CLIENT_USERNAME"]
    done = ensure_client_user(database_uri, username, env["MLFLOW_AUTH_CLIENT_PASSWORD"],
                              env["MLFLOW_AUTH_ADMIN_USERNAME"])
    print(f"wrote {env['MLFLOW_AUTH_CONFIG_PATH']}; clients' user {username!r}: {done}", file=sys.stderr)


if __name__ == "__main__":
    main()
