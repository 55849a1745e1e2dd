"""Issue 23, item 3: training text is also checked against the downstream eval *tasks* (their items, as
eval sources ``task:<name>``), and the held-out documents those items come from pass unchecked."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.data.test_decontaminate import write_step
from tidal.context import StepContext
from tidal.core.planner import build_graph
from tidal.data import decontaminate as decon
from tidal.data.eval_tasks import task_hash, task_texts
from tidal.data.heldout import HeldoutSplit, is_heldout
from tidal.recipe import parse_recipe

TASK = "tidal_brown_lastword"
SPLIT = HeldoutSplit(fraction=0.5, seed=3)


def _ids(held: bool, count: int) -> list[str]:
    found = (f"{i:064x}" for i in range(1000))
    return [d for d in found if is_heldout(d, SPLIT) == held][:count]


def test_a_task_item_in_a_training_document_is_removed_and_a_held_out_document_passes(tmp_path):
    item = task_texts(TASK)[0]
    own = "A paragraph of the document's own words, which no eval task holds anywhere at all today."
    (train_id,), (held_id,) = _ids(False, 1), _ids(True, 1)
    rows = [{"id": doc_id, "text": f"{own}\n\n{item}", "source": "t", "ref": ref, "language": "en", "fields": None}
            for doc_id, ref in ((train_id, "train"), (held_id, "held"))]
    write_step(tmp_path / "clean-train", rows)
    write_step(tmp_path / "clean-eval", [{"id": "e" * 64, "text": "unrelated eval text", "source": "ev",
                                          "ref": "e", "language": "en", "fields": None}])
    config = {"source": "t", "input": "clean-train", "threshold": 0.5, "eval": {"ev": "clean-eval"},
              "eval_tasks": {TASK: task_hash(TASK)}, "heldout": SPLIT.model_dump()}
    out = tmp_path / "out"
    out.mkdir()
    summary = decon.run(StepContext("d", "d", "decontaminate", config, out,
                                    {"clean-train": tmp_path / "clean-train", "clean-eval": tmp_path / "clean-eval"}))
    decon.check_outputs(config, out)
    removed = pq.read_table(out / decon.REMOVED_FILE).to_pylist()
    assert [(r["ref"], r["outcome"], r["eval_source"]) for r in removed] == [("train", "paragraph", f"task:{TASK}")]
    kept = {r["ref"]: r["text"] for r in pq.read_table(out / "documents-00000-of-00001.parquet").to_pylist()}
    assert kept == {"train": own, "held": f"{own}\n\n{item}"}  # the held-out document is not training text
    counts = json.loads((out / decon.COUNTS_FILE).read_text())
    assert counts["heldout_unchecked"] == 1 and counts["by_eval_source"] == {"ev": 0, f"task:{TASK}": 1}
    assert summary[f"contaminated_task:{TASK}"] == 1 and summary[f"index_ngrams_task:{TASK}"] > 1000


def test_a_task_edited_since_planning_is_refused(tmp_path):
    with pytest.raises(ValueError, match=rf"eval task {TASK}: its definition's hash .* plan again"):
        task_texts(TASK, expected_hash="0" * 64)


def test_the_plan_indexes_the_recipes_tasks_and_carries_the_split(tiny_data):
    from tests.data.test_decontaminate_pipeline import decontaminating

    graph = build_graph(parse_recipe(decontaminating(tiny_data)))
    config = graph["decontaminate-brown"].config
    assert config["eval_tasks"] == {t: task_hash(t) for t in graph["eval"].config["tasks"]}
    assert config["heldout"] == graph["tokenize-brown"].config["heldout"]
    del tiny_data["evaluation"]["downstream"], tiny_data["evaluation"]["heldout"]
    plain = build_graph(parse_recipe(tiny_data))["decontaminate-brown"].config
    assert "eval_tasks" not in plain and "heldout" not in plain  # ids of such recipes as before
