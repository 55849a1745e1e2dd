"""The docs' "Bring your own data" recipe (docs/tutorials/your-own-data.md) and the recipe field
reference are what tidal accepts today: the recipe plans (its files written as the walk-through
describes them), and the reference page the docs build generates (tools/docs/reference.py) holds
exactly ``tidal recipe-schema --markdown``."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tests.conftest import REPO

VENV_BIN = Path(sys.executable).parent

WALKTHROUGH = (REPO / "docs" / "tutorials" / "your-own-data.md").read_text()


def _byod_recipe() -> dict:
    block = re.search(r"```yaml\n(.*?)```", WALKTHROUGH, re.DOTALL)
    assert block is not None, "the walk-through has no yaml block"
    return yaml.safe_load(block.group(1))


def test_the_readme_reference_is_the_generated_one():
    done = subprocess.run([str(VENV_BIN / "tidal"), "recipe-schema", "--markdown"], capture_output=True, text=True,
                          timeout=120, check=True)
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "tools" / "docs" / "reference.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    page = generator.recipe_page()
    assert done.stdout.rstrip("\n") in page, "the docs' recipe reference page lacks `tidal recipe-schema --markdown`"
    assert "### ContinueFrom" in page and "### Source" in page  # a table per model, below the summary
    for field in ("sources.<name>.keep_fields", "mixture.size", "evaluation.heldout", "train.continue_from",
                  "licences"):
        assert f"`{field}`" in done.stdout, field


def test_the_walkthrough_recipe_plans_on_the_files_it_describes(tmp_path):
    recipe = _byod_recipe()
    (tmp_path / "data" / "web").mkdir(parents=True)
    rows = [{"id": f"n{i}", "url": f"https://notes.example/{i}", "text": f"Note {i} about the weather today."}
            for i in range(20)]
    (tmp_path / "data" / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.table({"body": [f"Web page {i} text." for i in range(20)]}),
                   tmp_path / "data" / "web" / "part-0.parquet")
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    done = subprocess.run([str(VENV_BIN / "tidal"), "plan", str(path)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path.parent, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fetch-notes-" in done.stdout and "train-" in done.stdout and "mixture: token_budget" in done.stdout, \
        done.stdout
    assert "pin sources.notes.snapshot_sha256" in done.stdout, done.stdout
