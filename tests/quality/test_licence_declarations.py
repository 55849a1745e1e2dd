"""Issue 21, item 1: SPDX licence expressions (checked with license-expression's SPDX list), the
recipe's own ``licences:`` section (inline or a file beside the recipe), errors at the source's
field, one line per problem, never the table; licence fields still never change a step id."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from tidal.core.planner import build_graph
from tidal.quality.licences import LICENCES, licence_decisions, licence_tags
from tidal.recipe import RecipeError, load_recipe, parse_recipe

REF = "licences.LicenseRef-acme-internal"
ACME = {"LicenseRef-acme-internal": {"uses": ["research"], "reason": "internal corpus, legal ticket LEG-4711"}}


def only(tiny_data, licence, uses, **extra):
    """The tiny recipe with every source under ``licence`` except ``udhr`` (the one under test)."""
    data = copy.deepcopy(tiny_data)
    for name, source in data["sources"].items():
        if name != "udhr":
            source["licence"] = "MIT"
    data["sources"]["udhr"]["licence"] = licence
    data["intended_use"] = uses
    data.update(extra)
    return data


def write(tmp_path, data, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def problem_lines(err: RecipeError) -> list[str]:
    """The indented problem lines under the ``N problem(s)`` header."""
    return [line.strip() for line in str(err).splitlines()[1:]]


@pytest.mark.parametrize("licence", ["PSF-2.0", "BSD-3-Clause", "BSD-2-Clause", "ISC", "MPL-2.0", "LGPL-2.1-or-later",
                                     "LGPL-3.0-or-later"])
def test_common_licences_are_accepted_for_research_and_commercial(tiny_data, licence):
    recipe = parse_recipe(only(tiny_data, licence, ["research", "commercial"]))
    decision = licence_decisions(recipe.sources, recipe.licences)["udhr"]
    assert {"research", "commercial"} <= set(decision["permitted_uses"]) and not decision["problems"]
    row = LICENCES[licence]
    assert row.source.startswith("https://") and "(" in row.source and row.note  # cites the text and its section


def test_an_internal_licence_ref_is_declared_with_its_uses_and_reason(tmp_path, tiny_data):
    recipe = load_recipe(write(tmp_path, only(tiny_data, "LicenseRef-acme-internal", ["research"], licences=ACME)))
    decision = licence_decisions(recipe.sources, recipe.licences)["udhr"]
    assert decision["permitted_uses"] == ["research"] and "LEG-4711" in decision["rule"]
    tags = licence_tags(recipe.sources, recipe.intended_use, recipe.licences)
    assert json.loads(tags["tidal.licence_declared.udhr"])["LicenseRef-acme-internal"]["uses"] == ["research"]

    path = write(tmp_path, only(tiny_data, "LicenseRef-acme-internal", ["research", "commercial"], licences=ACME))
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    [line] = problem_lines(err.value)
    assert line.startswith("sources.udhr.licence: licence gate: LicenseRef-acme-internal does not permit intended "
                           "use 'commercial' (rule: LicenseRef-acme-internal: declared in the recipe's licences: "
                           "internal corpus, legal ticket LEG-4711)")


def test_an_undeclared_licence_ref_or_unlisted_spdx_id_is_refused_with_the_declaration_that_fixes_it(tiny_data):
    for licence in ("LicenseRef-acme-internal", "WTFPL"):
        with pytest.raises(RecipeError) as err:
            parse_recipe(only(tiny_data, licence, ["research"]))
        [line] = problem_lines(err.value)  # one line, no table of known licences
        assert line.startswith(f"sources.udhr.licence: licence gate: licence {licence} not in tidal's table")
        assert f"`licences: {{{licence}: {{uses: [research], reason: " in line
        assert "CC0-1.0" not in line
        declared = only(tiny_data, licence, ["research"], licences={licence: {"uses": ["research"], "reason": "ok"}})
        recipe = parse_recipe(declared)
        assert licence_decisions(recipe.sources, recipe.licences)["udhr"]["permitted_uses"] == ["research"]


@pytest.mark.parametrize("declaration, rule", [
    ({"uses": ["research"]}, REF + ".reason: Field required"),
    ({"uses": ["research"], "reason": "   "}, REF + ".reason: must say why"),
    ({"reason": "legal ticket LEG-1"}, REF + ".uses: Field required"),
    ({"uses": ["training"], "reason": "legal ticket LEG-1"}, REF + ".uses.0: Input should be"),
    ({"uses": ["research", "research"], "reason": "x"}, REF + ".uses: a use is listed twice"),
    ({"uses": ["research"], "reason": "x", "permits": "all"}, REF + ".permits: unknown field"),
])
def test_a_declaration_without_a_reason_or_with_unknown_uses_is_refused_at_its_field(tiny_data, declaration, rule):
    data = only(tiny_data, "LicenseRef-acme-internal", ["research"],
                licences={"LicenseRef-acme-internal": declaration})
    with pytest.raises(RecipeError) as err:
        parse_recipe(data)
    [line] = problem_lines(err.value)
    assert line.startswith(rule), line


@pytest.mark.parametrize("licence, problem", [
    ("MIT OR", "not a valid SPDX licence expression: OR requires two or more licenses"),
    ("(MIT", "not a valid SPDX licence expression: Invalid expression"),
    ("MIT Apache-2.0", "Invalid symbols sequence"),
    ("MIT/Apache-2.0", "Invalid license key"),
    ("Foo-1.0", "'Foo-1.0' is not on the SPDX licence list"),
    ("LicenseRef-acme_internal", "a LicenseRef- id has only letters, digits, '.' and '-'"),
    ("Classpath-exception-2.0", "exception symbol can only be used as an exception"),
    ("", "empty licence expression"),
])
def test_an_invalid_licence_expression_is_refused_naming_the_parse_problem(tiny_data, licence, problem):
    with pytest.raises(RecipeError) as err:
        parse_recipe(only(tiny_data, licence, ["research"]))
    [line] = problem_lines(err.value)
    assert line.startswith("sources.udhr.licence: ") and problem in line, line


def test_or_permits_the_union_and_and_the_intersection(tiny_data):
    cases = {
        "CC-BY-NC-4.0 OR MIT": ["commercial", "redistribution_of_weights", "research"],
        "CC-BY-NC-4.0 AND MIT": ["research"],
        "MIT AND (CC-BY-SA-4.0 OR CC-BY-NC-4.0)": ["commercial", "research"],
        "GPL-2.0-or-later WITH Classpath-exception-2.0": ["commercial", "research"],
        "mit": ["commercial", "redistribution_of_weights", "research"],
        "LicenseRef-acme-internal OR Apache-2.0": ["commercial", "redistribution_of_weights", "research"],
        "LicenseRef-acme-internal AND Apache-2.0": ["research"],
    }
    for licence, uses in cases.items():
        recipe = parse_recipe(only(tiny_data, licence, ["research"], licences=ACME))
        decision = licence_decisions(recipe.sources, recipe.licences)["udhr"]
        assert decision["licence_uses"] == uses, licence
    assert parse_recipe(only(tiny_data, "GPL-2.0+", ["research"])).sources["udhr"].licence == "GPL-2.0-or-later"
    with pytest.raises(RecipeError, match="CC-BY-NC-4.0 AND MIT does not permit intended use 'commercial'"):
        parse_recipe(only(tiny_data, "CC-BY-NC-4.0 AND MIT", ["commercial"]))
    # an unknown id is refused whatever the operator: the gate never guesses a licence's uses
    with pytest.raises(RecipeError, match="licence WTFPL not in tidal's table"):
        parse_recipe(only(tiny_data, "MIT OR WTFPL", ["research"]))


def test_a_declaration_overrides_the_table_for_this_recipe_only(tiny_data):
    narrowed = only(tiny_data, "MIT", ["commercial"],
                    licences={"MIT": {"uses": ["research"], "reason": "our counsel reads MIT narrowly, memo 12"}})
    with pytest.raises(RecipeError) as err:
        parse_recipe(narrowed)
    assert "sources.udhr.licence: licence gate: MIT does not permit intended use 'commercial'" in str(err.value)
    assert "memo 12" in str(err.value)
    assert parse_recipe(only(tiny_data, "MIT", ["commercial"])).intended_use == ["commercial"]  # the table is untouched
    assert LICENCES["MIT"].uses == frozenset({"research", "commercial", "redistribution_of_weights"})


def test_two_keys_naming_one_licence_are_refused(tiny_data):
    data = only(tiny_data, "MIT", ["research"], licences={"MIT": {"uses": ["research"], "reason": "a"},
                                                          "mit": {"uses": ["commercial"], "reason": "b"}})
    with pytest.raises(RecipeError, match="licences: licence 'mit' is declared twice"):
        parse_recipe(data)
    with pytest.raises(RecipeError, match=r"licences.'MIT OR ISC'.\(name\): 'MIT OR ISC': declare one licence id"):
        parse_recipe(only(tiny_data, "MIT", ["research"], licences={"MIT OR ISC": {"uses": [], "reason": "c"}}))


def test_licence_override_widens_a_declared_licence(tiny_data):
    data = only(tiny_data, "LicenseRef-acme-internal", ["research", "commercial"], licences=ACME)
    data["sources"]["udhr"]["licence_override"] = {"uses": ["commercial"], "reason": "board decision BD-2026-3"}
    recipe = parse_recipe(data)
    decision = licence_decisions(recipe.sources, recipe.licences)["udhr"]
    assert decision["permitted_uses"] == ["commercial", "research"] and "BD-2026-3" in decision["rule"]


def test_the_section_may_name_a_file_beside_the_recipe(tmp_path, tiny_data, monkeypatch):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "team-licences.yaml").write_text(yaml.safe_dump(ACME))
    path = write(folder, only(tiny_data, "LicenseRef-acme-internal", ["research"], licences="team-licences.yaml"))
    monkeypatch.chdir(tmp_path)  # resolved against the recipe file, not the current directory
    recipe = load_recipe(path)
    assert recipe.licences["LicenseRef-acme-internal"].reason == "internal corpus, legal ticket LEG-4711"

    (folder / "team-licences.yaml").write_text(yaml.safe_dump({"LicenseRef-acme-internal": {"uses": ["research"]}}))
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    [line] = problem_lines(err.value)
    assert line.startswith(f"{REF}.reason: in {folder / 'team-licences.yaml'}: Field required")
    path = write(folder, only(tiny_data, "LicenseRef-acme-internal", ["research"], licences="missing.yaml"))
    with pytest.raises(RecipeError, match=r"licences: licences file: .*missing.yaml: cannot read licences"):
        load_recipe(path)
    (folder / "list.yaml").write_text("- LicenseRef-acme-internal\n")
    path = write(folder, only(tiny_data, "LicenseRef-acme-internal", ["research"], licences="list.yaml"))
    with pytest.raises(RecipeError, match=r"licences: licences file .*list.yaml: must be a YAML mapping"):
        load_recipe(path)
    with pytest.raises(RecipeError, match="is relative, and this recipe was given as data"):
        parse_recipe(only(tiny_data, "LicenseRef-acme-internal", ["research"], licences="team-licences.yaml"))


def test_declaring_licences_never_changes_a_step_id(tmp_path, tiny_data):
    base = [s.step_id for s in build_graph(parse_recipe(tiny_data))]
    declared = copy.deepcopy(tiny_data)
    declared["licences"] = {**ACME, "LicenseRef-Brown-Corpus": {"uses": ["research", "commercial"],
                                                                "reason": "licensed from Brown, contract 9"}}
    declared["sources"]["udhr"]["licence"] = "LicenseRef-acme-internal OR MIT"
    declared["intended_use"] = ["research", "commercial"]
    assert [s.step_id for s in build_graph(parse_recipe(declared))] == base
    (tmp_path / "lic.yaml").write_text(yaml.safe_dump(declared.pop("licences")))
    declared["licences"] = "lic.yaml"
    assert [s.step_id for s in build_graph(load_recipe(write(tmp_path, declared)))] == base


def test_tidal_plan_prints_one_error_line_at_the_source_field_and_no_traceback(tmp_path, tiny_data):
    data = only(tiny_data, "LicenseRef-acme-internal", ["research", "commercial"], licences=ACME)
    recipe = write(tmp_path, data)
    plan = subprocess.run([sys.executable, "-m", "tidal", "plan", str(recipe), "--storage-root", str(tmp_path / "s")],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 2, plan.stderr[-2000:]
    errors = [line for line in plan.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {recipe}: 1 problem(s) in the recipe:"], plan.stderr[-2000:]
    assert "  sources.udhr.licence: licence gate: LicenseRef-acme-internal does not permit intended use 'commercial'" \
        in plan.stderr
    assert "Traceback" not in plan.stderr and not (tmp_path / "s").exists()


def test_recipe_schema_documents_the_licences_section(capsys):
    from tidal.cli import main

    assert main(["recipe-schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    forms = schema["properties"]["licences"]["anyOf"]
    assert {"$ref": "#/$defs/LicenceDeclaration"} in [f.get("additionalProperties") for f in forms]
    assert forms[1]["type"] == "string" and "relative to the recipe file" in forms[1]["description"]
    assert set(schema["$defs"]["LicenceDeclaration"]["required"]) == {"uses", "reason"}
    assert "LicenseRef-" in schema["$defs"]["Source"]["properties"]["licence"]["description"]


def test_the_parent_run_records_the_declarations_a_source_uses(tmp_path, tiny_data, monkeypatch):
    from mlflow.tracking import MlflowClient

    from tidal.core.pipeline import Pipeline

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "team.yaml").write_text(yaml.safe_dump(ACME))
    data = only(tiny_data, "LicenseRef-acme-internal OR CC-BY-NC-4.0", ["research"], licences="team.yaml")
    pipe = Pipeline.load(write(tmp_path, data))
    tags = MlflowClient(pipe.tracking_uri).get_run(pipe.parent_run("declared")).data.tags
    assert tags["tidal.licence.udhr"] == "LicenseRef-acme-internal OR CC-BY-NC-4.0"
    assert json.loads(tags["tidal.licence_declared.udhr"]) == {"LicenseRef-acme-internal": {
        "uses": ["research"], "reason": "internal corpus, legal ticket LEG-4711", "source": None}}
    assert "tidal.licence_declared.brown" not in tags  # MIT: the table's row
