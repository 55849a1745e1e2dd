"""Airflow DAG file: one DAG per recipe in ``recipes/`` (or ``$TIDAL_RECIPES_DIR``), one task per step.

Thin on purpose (Airflow's dag-processor parses it often): it reads recipe YAML and plans
step graphs; every heavy import happens inside tasks.
"""

import os
from pathlib import Path

from operators.dag_factory import build_dags

RECIPES_DIR = Path(os.environ.get("TIDAL_RECIPES_DIR", Path(__file__).resolve().parent.parent / "recipes"))

globals().update(build_dags(RECIPES_DIR))
