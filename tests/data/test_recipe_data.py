"""Recipe fields of the data steps: file sources, per-source filters and languages, near-dedup."""

from __future__ import annotations

import copy

import pytest

from tidal.core.planner import build_graph
from tidal.data.clean import CleanConfig
from tidal.recipe import RecipeError, parse_recipe


def with_source(data: dict, name: str, source: dict) -> dict:
    data = copy.deepcopy(data)
    data["sources"][name] = source
    data["evaluation"]["sources"] = [*data["evaluation"]["sources"], name]
    return data


def test_tiny_recipe_plans_clean_configs_the_clean_step_accepts(tiny_data):
    graph = build_graph(parse_recipe(tiny_data))
    for src in ("brown", "gcide", "songci", "udhr"):
        CleanConfig.from_config(graph[f"clean-{src}"].config)  # raises on anything it does not know
    brown, songci, udhr = (graph[f"clean-{s}"].config for s in ("brown", "songci", "udhr"))
    assert brown["filters"] == {"c4": {}, "gopher_repetition": {}, "gopher_quality": {}}
    assert songci["filters"] == {"c4": None, "gopher_repetition": {}, "gopher_quality": None}
    assert udhr["filters"] == {"c4": None, "gopher_repetition": None, "gopher_quality": None}
    assert brown["language"] == {"allowed": ["en"], "min_confidence": 0.5}
    assert udhr["language"] == {"allowed": None, "min_confidence": 0.0}
    assert brown["near_dedup"]["enabled"] is True


def test_a_per_source_section_replaces_only_that_section(tiny_data):
    data = copy.deepcopy(tiny_data)
    data["clean"]["filters"] = {"gopher_repetition": {"max_dup_line_fraction": 0.5}, "c4": {}}
    data["sources"]["gcide"]["filters"] = {"c4": None}
    graph = build_graph(parse_recipe(data))
    assert graph["clean-gcide"].config["filters"] == {
        "c4": None, "gopher_repetition": {"max_dup_line_fraction": 0.5}, "gopher_quality": None}


def test_file_sources_plan_a_fetch_of_their_path(tiny_data, tmp_path):
    data = with_source(tiny_data, "web", {"format": "jsonl", "path": str(tmp_path), "licence": "CC0-1.0",
                                          "text_field": "content"})
    graph = build_graph(parse_recipe(data))
    assert graph["fetch-web"].config == {"source": "web", "format": "jsonl", "path": str(tmp_path),
                                         "text_field": "content", "max_documents": None}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"format": "jsonl", "licence": "CC0-1.0"}, "give `path` and no `archive`"),
        ({"format": "brown", "path": "/x", "licence": "CC0-1.0"}, "give `archive` and no `path`"),
        ({"format": "csv", "path": "/x", "licence": "CC0-1.0"}, "format"),
        ({"format": "jsonl", "path": "/x", "licence": "CC0-1.0", "filters": {"gopher": {}}}, "gopher"),
        ({"format": "jsonl", "path": "/x", "licence": "CC0-1.0", "filters": {"c4": {"min_sentencs": 2}}},
         "unknown key"),
        ({"format": "jsonl", "path": "/x", "licence": "CC0-1.0", "language": {"min_confidence": 2}}, "min_confidence"),
    ],
)
def test_bad_source_fields_are_refused(tiny_data, source, message):
    with pytest.raises(RecipeError, match=message):
        parse_recipe(with_source(tiny_data, "web", source))


def test_clean_policies_and_near_dedup_are_validated(tiny_data):
    for field, value in (("invalid_utf8", "ignore"), ("special_tokens", "drop"),
                         ("near_dedup", {"enabled": True, "jaccard_threshold": 0}),
                         ("near_dedup", {"bandz": 3})):
        data = copy.deepcopy(tiny_data)
        data["clean"][field] = value
        with pytest.raises(RecipeError, match=f"clean.{field}"):
            parse_recipe(data)
