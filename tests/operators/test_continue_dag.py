"""A recipe that continues a committed train step parses into a DAG whose ``continue-from`` task (the
parent, read and never computed) feeds ``train``, on the local launcher and on GKE alike."""

from __future__ import annotations

import pytest
import yaml

from operators.dag_factory import build_dag
from tests.conftest import TINY
from tests.core.test_continuation import commit_parent
from tests.operators.test_gke import POD


@pytest.mark.parametrize("resources", [{}, POD], ids=["local", "gke"])
def test_continued_recipe_dag(tmp_path, resources):
    parent = commit_parent(tmp_path / "root")
    data = yaml.safe_load(TINY.read_text())
    data["storage_root"] = str(tmp_path / "root")
    data["train"] |= {"steps": 800, "continue_from": {"step": parent}, "resources": resources}
    recipe = tmp_path / "continued.yaml"
    recipe.write_text(yaml.safe_dump(data))
    dag = build_dag(recipe)
    ref = dag.task_dict["continue-from"]
    assert type(ref).__name__ == "TidalStepOperator" and parent in ref.doc_md
    first = dag.task_dict["train.prepare" if resources else "train"]
    assert "continue-from" in first.upstream_task_ids
