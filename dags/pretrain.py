"""Airflow DAG file: one DAG per recipe in ``recipes/`` (or ``$TIDAL_RECIPES_DIR``), one task per step.

Thin on purpose (Airflow's dag-processor parses it often): it reads recipe YAML and plans
step graphs; every heavy import happens inside tasks. A task's own process builds only its DAG.
"""

import os
from pathlib import Path

from airflow.sdk import get_parsing_context

from operators.dag_factory import build_dags

RECIPES_DIR = Path(os.environ.get("TIDAL_RECIPES_DIR", Path(__file__).resolve().parent.parent / "recipes"))

# A task process parses this file for one DAG (its parsing context): only that recipe is built.
globals().update(build_dags(RECIPES_DIR, only=get_parsing_context().dag_id))
