#!/usr/bin/env bash
# `make airflow`: Airflow 3 with its UI on this machine, tidal's DAG and on-call plugin loaded.
# `airflow standalone` (scheduler, dag-processor, triggerer, API server) on the SQLite database in
# $AIRFLOW_HOME (LocalExecutor), every recipe under $TIDAL_RECIPES_DIR a DAG. Prints the URL and
# the admin password once the server answers; Ctrl-C stops the whole process group.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PORT="${AIRFLOW_PORT:-8080}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$REPO/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$REPO/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__LAZY_LOAD_PLUGINS=False
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}"
export AIRFLOW__API__PORT="$PORT" AIRFLOW__API__HOST="${AIRFLOW_HOST:-127.0.0.1}"
export AIRFLOW__API__BASE_URL="http://${AIRFLOW_HOST:-127.0.0.1}:$PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$PORT/execution/"
export TIDAL_RECIPES_DIR="${TIDAL_RECIPES_DIR:-$REPO/recipes}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PATH="$REPO/.venv/bin:$PATH"
mkdir -p "$AIRFLOW_HOME"
LOG="$AIRFLOW_HOME/standalone.log"
setsid airflow standalone >"$LOG" 2>&1 &
PID=$!
trap 'kill -TERM -- -$PID 2>/dev/null || true; wait $PID 2>/dev/null || true' INT TERM EXIT
echo "starting airflow standalone (log: $LOG) ..."
for _ in $(seq 1 120); do
  if ! kill -0 $PID 2>/dev/null; then echo "error: airflow standalone exited; last lines of $LOG:"; tail -20 "$LOG"; exit 1; fi
  if curl -fsS "http://127.0.0.1:$PORT/api/v2/monitor/health" >/dev/null 2>&1; then break; fi
  sleep 2
done
PASSWORDS="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
echo
echo "  Airflow UI:   http://${AIRFLOW_HOST:-127.0.0.1}:$PORT   (DAGs: tidal_<recipe>; on-call page: /tidal-oncall/)"
echo "  login:        admin / $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin"])' "$PASSWORDS" 2>/dev/null || echo "see $PASSWORDS")"
echo "  recipes:      $TIDAL_RECIPES_DIR   storage: each recipe's storage_root (tiny: $REPO/.tidal)"
echo "  MLflow:       .venv/bin/mlflow ui --backend-store-uri sqlite:///$REPO/.tidal/mlflow.db  (the tiny recipe's store)"
echo "  Ctrl-C stops it."
wait $PID
