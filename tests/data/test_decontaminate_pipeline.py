"""The decontaminate step in the recipe and the step graph, in the stats, and on real data: planted copies
of UDHR paragraphs in Brown documents are removed, and nothing else of Brown is."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import TINY
from tidal.context import StepContext
from tidal.core.planner import build_graph
from tidal.data import clean, decontaminate, fetch
from tidal.data.archives import cache_dir
from tidal.data.filters import words
from tidal.data.neardup import fold_text
from tidal.data.shards import DOCUMENT_SCHEMA
from tidal.data.stats import decontaminate_rows
from tidal.recipe import RecipeError, parse_recipe


def decontaminating(data: dict) -> dict:
    """The tiny recipe with the decontamination its comment describes."""
    data["decontamination"] = {"n": 13, "threshold": 0.5, "remove": "paragraph"}
    data["gate"]["max_contaminated_fraction"] = 0.01
    return data


def test_training_sources_are_decontaminated_against_the_eval_sources(tiny_data):
    graph = build_graph(parse_recipe(decontaminating(tiny_data)))
    for src in ("brown", "gcide", "songci"):
        step = graph[f"decontaminate-{src}"]
        assert [s.name for s in step.inputs] == [f"clean-{src}", "clean-udhr"]
        assert {k: step.config[k] for k in ("n", "threshold", "remove", "eval")} == {
            "n": 13, "threshold": 0.5, "remove": "paragraph", "eval": {"udhr": "clean-udhr"}}
        assert graph[f"tokenize-{src}"].config["input"] == f"decontaminate-{src}"
    assert graph["tokenize-udhr"].config["input"] == "clean-udhr"  # the eval source itself is not checked
    assert graph["tokenizer"].config["sources"] == ["decontaminate-brown", "decontaminate-gcide",
                                                    "decontaminate-songci"]
    assert graph["stats"].config["decontaminate"] == {s: f"decontaminate-{s}" for s in ("brown", "gcide", "songci")}
    assert graph["gate"].config["max_contaminated_fraction"] == 0.01


def test_without_the_section_no_step_and_the_clean_steps_are_read(tiny_data):
    graph = build_graph(parse_recipe(tiny_data))
    assert not [s for s in graph if s.kind == "decontaminate"]
    assert graph["tokenize-brown"].config["input"] == "clean-brown"
    assert "decontaminate" not in graph["stats"].config
    assert "max_contaminated_fraction" not in graph["gate"].config


def test_decontamination_needs_eval_sources(tiny_data):
    decontaminating(tiny_data)
    tiny_data["evaluation"]["sources"] = []
    tiny_data["mixture"]["weights"]["udhr"] = 0.1
    with pytest.raises(RecipeError, match=r"  decontamination: needs evaluation.sources to check"):
        parse_recipe(tiny_data)


def test_stats_rows_count_per_source_and_eval_source():
    counts = {"brown": {"in": 100, "documents_contaminated": 2, "paragraphs_contaminated": 3,
                        "by_eval_source": {"udhr": 3}},
              "songci": {"in": 300, "documents_contaminated": 0, "paragraphs_contaminated": 0,
                         "by_eval_source": {"udhr": 0}}}
    rows = {(s, m): v for s, m, v in decontaminate_rows(counts)}
    assert rows[("brown", "contaminated_rate")] == 0.02 and rows[("brown", "contaminated/udhr")] == 3
    assert rows[("all", "contaminated_rate")] == 2 / 400 and rows[("all", "paragraphs_contaminated")] == 3


def _fetch_clean(tmp, pipe, source: str, n: int):
    fetch_config = {**pipe.graph[f"fetch-{source}"].config, "max_documents": n}
    if not (cache_dir() / fetch_config["archive"]["filename"]).is_file():
        pytest.skip(f"{fetch_config['archive']['filename']} not in the archive cache (run `make corpora`)")
    fetch_dir, clean_dir = tmp / f"fetch-{source}", tmp / f"clean-{source}"
    fetch_dir.mkdir()
    fetch.run(StepContext("f", f"fetch-{source}", "fetch", fetch_config, fetch_dir))
    clean_dir.mkdir()
    clean.run(StepContext("c", f"clean-{source}", "clean", dict(pipe.graph[f"clean-{source}"].config), clean_dir,
                          {f"fetch-{source}": fetch_dir}))
    return clean_dir


def test_planted_udhr_paragraphs_are_removed_from_brown(tmp_path, tiny_data):
    from tidal.core.load import load_pipeline

    pipe = load_pipeline(TINY, storage_root=str(tmp_path / "store"))
    udhr = _fetch_clean(tmp_path, pipe, "udhr", 40)
    brown = _fetch_clean(tmp_path, pipe, "brown", 40)
    udhr_docs = [t for p in sorted(udhr.glob("documents-*.parquet"))
                 for t in pq.read_table(p).column("text").to_pylist()]
    lines = [line for text in udhr_docs for line in text.split("\n") if len(words(fold_text(line))) >= 20]
    paragraphs = lines[::7][:6]
    assert len(paragraphs) == 6
    rows = [r for p in sorted(brown.glob("documents-*.parquet")) for r in pq.read_table(p).to_pylist()]
    originals = {r["ref"]: r["text"] for r in rows}
    planted = {}
    for i, para in enumerate(paragraphs):  # at the end of a document, or between its first two paragraphs
        row = rows[3 * i]
        head, _, tail = row["text"].partition("\n\n")
        row["text"] = f"{row['text']}\n\n{para}" if i % 2 else f"{head}\n\n{para}\n\n{tail}"
        planted[row["ref"]] = para
    shards = len(list(brown.glob("documents-*.parquet")))
    dirty = tmp_path / "clean-brown-planted"
    dirty.mkdir()
    for k in range(shards):
        part = [r for r in rows if int(r["id"], 16) % shards == k]
        pq.write_table(pa.Table.from_pylist(part, schema=DOCUMENT_SCHEMA),
                       dirty / f"documents-{k:05d}-of-{shards:05d}.parquet")
    graph = build_graph(parse_recipe(decontaminating(tiny_data)))
    config = {**graph["decontaminate-brown"].config, "input": "clean-brown-planted"}
    out = tmp_path / "decontaminate-brown"
    out.mkdir()
    summary = decontaminate.run(StepContext("d", "decontaminate-brown", "decontaminate", config, out,
                                            {"clean-brown-planted": dirty, "clean-udhr": udhr}))
    decontaminate.check_outputs(config, out)
    removed = pq.read_table(out / decontaminate.REMOVED_FILE).to_pylist()
    assert {r["ref"] for r in removed} == set(planted)  # every planted paragraph, and nothing of Brown's own
    assert all(r["outcome"] == "paragraph" and r["eval_source"] == "udhr" and r["share"] == 1.0 for r in removed)
    kept = {r["ref"]: r["text"] for p in sorted(out.glob("documents-*.parquet"))
            for r in pq.read_table(p).to_pylist()}
    assert kept == originals  # the cut documents are Brown's own text again
    counts = json.loads((out / decontaminate.COUNTS_FILE).read_text())
    tasks = {f"task:{t}": 0 for t in graph["eval"].config["tasks"]}  # their items: held-out Brown documents
    assert counts["by_eval_source"] == {"udhr": 6, **tasks} and counts["documents_contaminated"] == 6
    assert summary["index_ngrams_udhr"] > 10_000
