"""One DAG per recipe in ``recipes/`` (or ``$TIDAL_RECIPES_DIR``): one task per tidal step."""

import os
from pathlib import Path

from operators.dag_factory import build_dags

RECIPES_DIR = Path(os.environ.get("TIDAL_RECIPES_DIR", Path(__file__).resolve().parent.parent / "recipes"))

globals().update(build_dags(RECIPES_DIR))
