"""Recipe fields of the data steps: file sources, per-source filters and languages, near-dedup."""

from __future__ import annotations

import copy

import pytest

from tidal.core.planner import build_graph
from tidal.data.clean import CleanConfig, CleanSettings
from tidal.data.decontaminate_config import DecontaminateConfig
from tidal.data.fetch_config import FetchConfig
from tidal.data.filters import QualityFilters
from tidal.data.mix_config import MixConfig
from tidal.data.snapshot import file_sha256, snapshot_sha256
from tidal.data.stats_config import StatsConfig
from tidal.data.tokenize_config import TokenizeConfig
from tidal.data.tokenizer_config import TokenizerConfig
from tidal.eval.config import EvalStepConfig
from tidal.quality.gate_config import GateConfig, GateSettings
from tidal.recipe import RecipeError, parse_recipe


def with_source(data: dict, name: str, source: dict) -> dict:
    data = copy.deepcopy(data)
    data["sources"][name] = source
    data["evaluation"]["sources"] = [*data["evaluation"]["sources"], name]
    return data


def test_tiny_recipe_plans_clean_configs_the_clean_step_accepts(tiny_data):
    graph = build_graph(parse_recipe(tiny_data))
    for src in ("brown", "gcide", "songci", "udhr"):
        CleanConfig.model_validate(graph[f"clean-{src}"].config)  # raises on anything it does not know
    brown, songci, udhr = (graph[f"clean-{s}"].config for s in ("brown", "songci", "udhr"))
    assert brown["filters"] == {"c4": {}, "gopher_repetition": {}, "gopher_quality": {}}
    assert songci["filters"] == {"c4": None, "gopher_repetition": {}, "gopher_quality": None}
    assert udhr["filters"] == {"c4": None, "gopher_repetition": None, "gopher_quality": None}
    assert brown["language"] == {"allowed": ["en"], "min_confidence": 0.5}
    assert udhr["language"] == {"allowed": None, "min_confidence": 0.0}
    assert brown["near_dedup"]["enabled"] is True


def test_every_planned_data_step_config_is_read_back_by_its_kind_model(tiny_data):
    """One model per kind: the recipe composes it, the planner dumps it, the kind reads the dict back
    unchanged (fetch and tokenizer hash a subset of their fields, to keep their step ids)."""
    models = {"fetch": FetchConfig, "clean": CleanConfig, "tokenizer": TokenizerConfig, "tokenize": TokenizeConfig,
              "mix": MixConfig, "stats": StatsConfig, "gate": GateConfig, "decontaminate": DecontaminateConfig,
              "eval": EvalStepConfig}
    tiny_data["decontamination"] = {}  # off in tiny.yaml; every default
    graph = build_graph(parse_recipe(tiny_data))
    assert {step.kind for step in graph} - {"train"} == set(models)
    for step in graph:
        if step.kind in ("fetch", "tokenizer"):
            models[step.kind].model_validate(step.config)
        elif step.kind in models:
            assert models[step.kind].model_validate(step.config).model_dump() == step.config, step.name
    recipe = parse_recipe(tiny_data)
    assert isinstance(recipe.clean, CleanSettings) and isinstance(recipe.gate, GateSettings)
    assert isinstance(recipe.sources["brown"].filters, QualityFilters)


def test_a_per_source_section_replaces_only_that_section(tiny_data):
    data = copy.deepcopy(tiny_data)
    data["clean"]["filters"] = {"gopher_repetition": {"max_dup_line_fraction": 0.5}, "c4": {}}
    data["sources"]["gcide"]["filters"] = {"c4": None}
    graph = build_graph(parse_recipe(data))
    assert graph["clean-gcide"].config["filters"] == {
        "c4": None, "gopher_repetition": {"max_dup_line_fraction": 0.5}, "gopher_quality": None}


def test_file_sources_plan_a_fetch_of_their_path(tiny_data, tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"content": "one"}\n')
    data = with_source(tiny_data, "web", {"format": "jsonl", "path": str(tmp_path), "licence": "CC0-1.0",
                                          "text_field": "content", "keep_fields": ["url"]})
    graph = build_graph(parse_recipe(data))
    assert graph["fetch-web"].config == {"source": "web", "format": "jsonl", "path": str(tmp_path),
                                         "text_field": "content", "id_field": None, "keep_fields": ["url"],
                                         "max_documents": None, "snapshot_sha256": snapshot_sha256(
                                             [("a.jsonl", *file_sha256(tmp_path / "a.jsonl"))])}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"format": "jsonl", "licence": "CC0-1.0"}, "give `path` and no `archive`"),
        ({"format": "brown", "path": "/x", "licence": "CC0-1.0"}, "give `archive` and no `path`"),
        ({"format": "csv", "path": "/x", "licence": "CC0-1.0"}, "format"),
        ({"format": "jsonl", "path": "/x", "licence": "CC0-1.0", "filters": {"gopher": {}}},
         "sources.web.filters.gopher: unknown field"),
        ({"format": "jsonl", "path": "/x", "licence": "CC0-1.0", "filters": {"c4": {"min_sentencs": 2}}},
         "sources.web.filters.c4.min_sentencs: unknown field"),
        ({"format": "jsonl", "path": "/x", "licence": "CC0-1.0", "filters": {"c4": {"filter_policy": "yes"}}},
         "sources.web.filters.c4.filter_policy: Input should be a valid boolean"),
        ({"format": "jsonl", "path": "/x", "licence": "CC0-1.0", "language": {"min_confidence": 2}},
         "sources.web.language.min_confidence: Input should be less than or equal to 1"),
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
