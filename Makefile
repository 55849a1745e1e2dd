# tidal: `make demo` runs the tiny recipe end to end through Airflow; `make test` runs the tests.
# Both install what they need: uv (from PyPI), the locked virtual environment, the corpora.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY ?= python3
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
VENV := .venv
RECIPE ?= recipes/tiny.yaml

export AIRFLOW_HOME ?= $(CURDIR)/.airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__UNIT_TEST_MODE := False
export TIDAL_ARCHIVE_CACHE ?= $(HOME)/.cache/tidal/archives
# One BPE trainer thread: byte-identical tokenizer.json across runs (see tidal/data/tokenizer.py).
export RAYON_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help uv venv bytecode corpora tools services services-stop demo airflow cluster-demo test test-fast test-tier setup flink-tools k8s-tools tpu-tools lint clean-demo

help:
	@echo "make demo   run the tiny recipe end to end through Airflow (installs everything first)"
	@echo "make test   run the test suite (what CI runs: every tier but slow benchmarks)"
	@echo "make test-fast   the unit tier only, for the edit loop (minutes)"
	@echo "make test-tier TIER=integration   one tier: unit, integration, cluster or e2e"
	@echo "make airflow  Airflow's UI on this machine (airflow standalone, tidal's DAGs and on-call page); prints URL and password"
	@echo "make cluster-demo   the tiny recipe through Airflow in production shape (Celery workers on nodes; root)"
	@echo "make lint   ruff and the import-linter layer contracts"
	@echo "make docs   the docs site into site/ (mkdocs build --strict; reference pages generated from the code)"
	@echo "make services / services-stop   PostgreSQL + Redis on loopback for running tests by hand"
	@echo "make tools  Flink and the Beam Flink job server for the test cluster (make test runs it)"

$(UV):
	$(PY) -m pip install --quiet --user 'uv>=0.9' || $(PY) -m pip install --quiet 'uv>=0.9'

uv: $(UV)

# --compile-bytecode: write every installed module's .pyc once, here. Python reads .pyc files
# even under PYTHONDONTWRITEBYTECODE=1 (set on these machines), which otherwise makes every
# process compile Airflow, JAX, Beam and MLflow from source: 12 s -> 4.6 s to import them,
# paid by every Airflow task, trainer and server process the demo and the tests start.
$(VENV)/.synced: pyproject.toml uv.lock | $(UV)
	@echo "== the locked virtual environment (uv sync: ~330 packages; then bytecode is compiled, about a minute with no output)"
	$(UV) sync --frozen --python 3.11 --compile-bytecode
	touch $@

venv: $(VENV)/.synced

# The same for this repository's own modules (an editable install: uv compiles none of them), about a
# second: every node, Airflow task and trainer the tests start imports tidal, and none writes a .pyc
# (PYTHONDONTWRITEBYTECODE=1 here; the test cluster's nodes see the repository read-only).
# A .pyc whose source changed since is ignored by Python (its header holds the source's mtime and size).
bytecode: venv
	$(VENV)/bin/python -m compileall -q -j 0 tidal operators dags plugins tests bench > /dev/null

corpora: venv
	@echo "== the recipe's pinned source archives (downloaded once into $(TIDAL_ARCHIVE_CACHE), sha256 checked)"
	$(VENV)/bin/tidal archives $(RECIPE)

$(AIRFLOW_HOME)/airflow.db: | venv
	@echo "== Airflow's metadata database (airflow db migrate, once; about a minute)"
	mkdir -p $(AIRFLOW_HOME)
	$(VENV)/bin/airflow db migrate > $(AIRFLOW_HOME)/migrate.log 2>&1 || (tail -30 $(AIRFLOW_HOME)/migrate.log; exit 1)

# Airflow with its UI on this machine: every recipe a DAG, trigger them from the browser (AIRFLOW_PORT=8080).
airflow: corpora $(AIRFLOW_HOME)/airflow.db
	bash tools/airflow_local.sh

# The DAG run's progress streams as it happens (step started / committed with its seconds, the trainer's line
# every log_every steps: step, loss, tokens/s, ETA), every filter line-buffered (a cut or an unbuffered pipe
# to a file would hold it back); the full log is in $(AIRFLOW_HOME)/demo.log.
DEMO_LINES := \[tidal\.runner\]|step [0-9]+/[0-9]+ loss |eval_loss/|TidalStepOperator\].*skip |ERROR|error
DEMO_CLEAN := s/ +\[[a-z_.]+\] loc=.*$$//; s/^[0-9T:.-]+Z \[[a-z ]+\] //; s/^\[[0-9T:., -]+\] \{[^}]*\} [A-Z]+ - //
# When the plan says every step is committed there is nothing for Airflow to do: the run is skipped (as make
# skips an up-to-date target) and the report shows the committed run; `make clean-demo` starts over.
demo: corpora bytecode $(AIRFLOW_HOME)/airflow.db
	@echo "== tidal plan" && set -o pipefail && $(VENV)/bin/tidal plan $(RECIPE) | tee $(AIRFLOW_HOME)/plan.txt
	@if ! grep -qE "^  [A-Za-z0-9_.-]+-[0-9a-f]{12} +(run|blocked) " $(AIRFLOW_HOME)/plan.txt; then \
	  echo "== every step is committed: nothing for Airflow to run (make clean-demo starts over)"; \
	  $(VENV)/bin/tidal report $(RECIPE); exit $$?; fi; \
	echo "== airflow dags test tidal_tiny: 18 steps, about 3-4 minutes on a quiet 2-core machine, 8-14 under load (full log: $(AIRFLOW_HOME)/demo.log)"; \
	start=$$(date +%s); \
	  $(VENV)/bin/airflow dags test tidal_tiny 2>&1 | tee $(AIRFLOW_HOME)/demo.log \
	    | grep --line-buffered -E "$(DEMO_LINES)" | grep --line-buffered -v "TidalStepOperator.*run " \
	    | sed -u -E '$(DEMO_CLEAN); s/^(.{160}).*/\1/'; rc=$${PIPESTATUS[0]}; \
	  echo "== airflow dags test finished in $$(( $$(date +%s) - start )) s (exit $$rc)"; \
	  [ $$rc -eq 0 ] && { echo "== airflow dags test tidal_tiny__checkpoints (catalog, evaluate; log: $(AIRFLOW_HOME)/checkpoints.log)"; \
	    $(VENV)/bin/airflow dags test tidal_tiny__checkpoints > $(AIRFLOW_HOME)/checkpoints.log 2>&1 || rc=$$?; \
	    grep -E "committed checkpoint|checkpoint eval|evaluated:|eval curve" $(AIRFLOW_HOME)/checkpoints.log \
	      | sed -E '$(DEMO_CLEAN)' | cut -c1-160; }; \
	  $(VENV)/bin/tidal report $(RECIPE); exit $$rc

# Production shape on one machine (tests/cluster/demo.py): scheduler, dag-processor, api-server and
# triggerer on PostgreSQL, CeleryExecutor on Redis, two Celery workers each on a node of the test
# cluster, MLflow and an s3:// root on the loopback S3 server; everything stopped by process group.
# CLUSTER_DEMO_ARGS: --recipe slice (shorter), --hold SECONDS (keep the UIs up after the run).
cluster-demo: setup
	bash .ci/services.sh run -- $(VENV)/bin/python -m tests.cluster.demo $(CLUSTER_DEMO_ARGS)

# The tests by tier (marked by folder, tests/tiers.py): unit, integration, cluster, e2e. Three xdist
# workers on CI's 2 cores (the cluster tests mostly wait on their nodes: with two workers the cores were
# busy 67% of the time); --dist loadgroup keeps each group of tests/tiers.py on one worker: the cluster
# tier's two groups (each its own test cluster; the API server's users in "kube") and the operations
# server start first, one per worker (tests/conftest.py), and every other file's fixtures are built once.
# Measured on a clean clone: .ci/run 1,596-1,872 s (three runs) with 3 workers, 1,864 s with 2, before the
# cluster tier grew; on 2026-12-07 3,844 s (pytest 3,761 s, the cores 0 % idle throughout), then 3,120 s
# (pytest 3,031 s) after that day's CPU cuts; on 2026-12-07 later, 2,208 s (pytest 2,106 s) with MLflow's
# job runners off. The suite's summary prints the CPU seconds of each file.
# PostgreSQL and Redis from Debian's packages, started for the suite and stopped after it
# (.ci/services.sh: own process groups; servers already listening are reused, not stopped).
PYTEST_WORKERS ?= 3
PYTEST := $(VENV)/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=30
test: setup bytecode
	bash .ci/services.sh run -- $(PYTEST)

# The unit tier alone (no server, no cluster): the edit loop, a few minutes.
test-fast: corpora bytecode
	$(PYTEST) -m "unit and not slow"

# One tier: make test-tier TIER=integration (unit, integration, cluster, e2e).
TIER ?= unit
test-tier: setup bytecode
	bash .ci/services.sh run -- $(PYTEST) -m "$(TIER) and not slow"

# Flink 1.19 (PyPI's apache-flink packages) and Beam's Flink job server (shaded from Maven Central)
# for the Flink cluster of the test cluster, and the Kubernetes tools (Helm, kube-apiserver, kubectl,
# the JobSet CRD; tools/k8s/install.sh) for the API server tests; cached by version under
# ~/.cache/tidal/tools, once per machine (a cold build of Helm and kube-apiserver takes ~10 minutes).
tools: flink-tools k8s-tools tpu-tools
flink-tools:
	bash tools/flink/install.sh
k8s-tools:
	bash tools/k8s/install.sh
# libtpu for `tidal size` (compiling a train step for a TPU slice on this CPU), outside the venv: about 700 MB
tpu-tools: venv
	bash tools/tpu/install.sh

# Everything the tests need, built concurrently (the venv and corpora, Flink, the Kubernetes tools, libtpu):
# on a fresh machine the Go builds of the Kubernetes tools are the long pole; cached, seconds.
setup:
	@start=$$(date +%s); $(MAKE) --no-print-directory -j3 corpora flink-tools k8s-tools tpu-tools \
	  && echo "== setup (venv, corpora, tools) took $$(( $$(date +%s) - start )) s"

services:
	bash .ci/services.sh start

services-stop:
	bash .ci/services.sh stop

# ruff (style, line length) and import-linter (the layer contracts in pyproject.toml).
lint: venv
	$(VENV)/bin/ruff check tidal operators dags tests plugins bench
	$(VENV)/bin/lint-imports

# The docs site (mkdocs.yml, docs/): the hook tools/docs/reference.py generates the reference pages
# (recipe fields, CLI help, bench RESULT keys, environment) from the code; --strict fails on any
# broken link or anchor and on a page missing from the nav.
.PHONY: docs
docs: venv
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean-demo:
	rm -rf .tidal $(AIRFLOW_HOME)
