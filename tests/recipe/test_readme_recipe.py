"""The README's "Bring your own data" recipe and its field reference are what tidal accepts today:
the recipe plans (its files written as the walk-through describes them), and the reference table
is exactly ``tidal recipe-schema --markdown``."""

from __future__ import annotations

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

README = (REPO / "README.md").read_text()


def _byod_recipe() -> dict:
    section = README.split("## Bring your own data", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the walk-through has no yaml block"
    return yaml.safe_load(block.group(1))


def test_the_readme_reference_is_the_generated_one():
    done = subprocess.run([str(VENV_BIN / "tidal"), "recipe-schema", "--markdown"], capture_output=True, text=True,
                          timeout=120, check=True)
    start, end = "<!-- recipe-reference:start -->\n", "<!-- recipe-reference:end -->"
    assert start in README and end in README
    assert README.split(start, 1)[1].split(end, 1)[0] == done.stdout, \
        "README's recipe field reference is stale: paste `tidal recipe-schema --markdown` between its markers"
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
