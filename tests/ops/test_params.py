"""The trigger form: real Airflow Param validation, overrides through the recipe, run-time step ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ops.recipes import write_ops_recipe


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("params")
    return write_ops_recipe(base / "ops_ci.yaml", base / "storage")


@pytest.fixture(scope="module")
def dag(recipe):
    from operators.dag_factory import build_dag

    return build_dag(recipe)


@pytest.fixture(scope="module")
def gke_recipe(tmp_path_factory) -> Path:
    """The same recipe training with the gke launcher (a TPU v5e pod)."""
    import yaml

    base = tmp_path_factory.mktemp("params-gke")
    path = write_ops_recipe(base / "ops_gke.yaml", base / "storage", name="ops_gke")
    data = yaml.safe_load(path.read_text())
    data["train"]["resources"] = {"launcher": "gke", "accelerator": {"kind": "tpu", "type": "tpu-v5-lite-podslice",
                                                                     "topology": "2x4"}}
    data["train"]["batch_size"] = 64  # whole sequences on each of the 8 chips, and of every profile's 8 or 32
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_form_defaults_are_the_recipe_and_validate(dag, recipe):
    from airflow.sdk.definitions.param import ParamsDict

    from tidal.recipe import load_recipe

    r = load_recipe(recipe)
    values = ParamsDict(dag.params).validate()
    # a local DAG offers no launcher and no resource profile: its train task runs on this machine (issue 44)
    assert values == {"seed": r.seed, "train_steps": r.train.steps, "force_steps": [], "dry_run": False}
    schema = {k: p.schema for k, p in ParamsDict(dag.params).items()}
    assert schema["train_steps"]["minimum"] == 1 and schema["seed"]["minimum"] == 0
    assert schema["force_steps"]["items"]["enum"][-1] == "train"
    assert "null" in schema["force_steps"]["type"]  # optional: Airflow's form shows no required star
    params = ParamsDict(dag.params)
    params["force_steps"] = None  # left empty in the form
    assert params.validate()["force_steps"] is None


def test_a_gke_dag_offers_resource_profiles_and_no_launcher(gke_recipe):
    from airflow.sdk.definitions.param import ParamsDict

    from operators.dag_factory import build_dag
    from operators.params import RESOURCE_PROFILES

    params = ParamsDict(build_dag(gke_recipe).params)
    assert "launcher" not in params and params["resource_profile"] == "recipe"
    assert params.get_param("resource_profile").schema["enum"] == list(RESOURCE_PROFILES)


@pytest.mark.parametrize("name,value,rule", [
    ("seed", -1, "less than the minimum"),
    ("seed", "7", "is not of type 'integer'"),
    ("train_steps", 0, "less than the minimum"),
    ("train_steps", 2.5, "is not of type 'integer'"),
    ("force_steps", ["no-such-step"], "is not one of"),
    ("force_steps", ["train", "train"], "non-unique elements"),
    ("dry_run", "yes", "is not of type 'boolean'"),
])
def test_invalid_values_are_refused_by_the_param(dag, name, value, rule):
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    params = ParamsDict(dag.params)
    with pytest.raises(ParamValidationError, match=rule):
        params[name] = value


def _ids(recipe: Path, params: dict) -> dict[str, str]:
    from operators.step import pipeline_for_run

    return {s.name: s.step_id for s in pipeline_for_run(str(recipe), {"params": params}).graph}


def test_an_override_changes_a_step_id_only_where_it_changes_the_computation(dag, recipe):
    from airflow.sdk.definitions.param import ParamsDict

    defaults = ParamsDict(dag.params).validate()
    base = _ids(recipe, defaults)
    assert base == {s.name: s.step_id for s in __import__("tidal.core.load").core.load.load_pipeline(recipe).graph}

    steps = _ids(recipe, {**defaults, "train_steps": defaults["train_steps"] + 5})
    assert [n for n in base if base[n] != steps[n]] == ["train"]

    seed = _ids(recipe, {**defaults, "seed": defaults["seed"] + 1})
    # the seed draws the mixture and the held-out split (evaluation.heldout), which the tokenizer
    # carries (it never trains on held-out documents): so every tokenize step, whose input it is
    held = ["tokenizer", *(n for n in base if n.startswith("tokenize-"))]
    assert sorted(n for n in base if base[n] != seed[n]) == sorted([*held, "mix", "stats", "gate", "train"])

    for where in ({"dry_run": True}, {"force_steps": ["mix"]}, {"force_steps": None}):
        assert _ids(recipe, {**defaults, **where}) == base, where


def test_overrides_reach_the_recipe_and_defaults_make_none(dag, recipe):
    from airflow.sdk.definitions.param import ParamsDict

    from operators.params import overrides_from_params
    from operators.step import pipeline_for_run
    from tidal.core.load import load_pipeline
    from tidal.recipe import load_recipe

    defaults = ParamsDict(dag.params).validate()
    assert overrides_from_params(load_recipe(recipe), defaults) == {}
    assert pipeline_for_run(str(recipe), {"params": defaults}).recipe_hash == load_pipeline(recipe).recipe_hash
    pipe = pipeline_for_run(str(recipe), {"params": {**defaults, "train_steps": 3}})
    assert pipe.recipe.train.steps == 3
    with pytest.raises(ValueError, match="local launcher, which takes the recipe's resources only"):
        overrides_from_params(load_recipe(recipe), {**defaults, "resource_profile": "tpu-v5e-2x4"})


def test_a_profile_reaches_a_gke_recipe_and_changes_no_id(gke_recipe):
    from operators.params import overrides_from_params
    from operators.step import pipeline_for_run
    from tidal.core.load import load_pipeline
    from tidal.recipe import load_recipe

    defaults = {"seed": load_recipe(gke_recipe).seed, "train_steps": 10, "resource_profile": "recipe",
                "force_steps": [], "dry_run": False}
    assert overrides_from_params(load_recipe(gke_recipe), defaults) == {}
    base = {s.name: s.step_id for s in load_pipeline(gke_recipe).graph}
    for profile in ("gpu-h100-8", "tpu-v5p-2x2x4-multislice"):
        pipe = pipeline_for_run(str(gke_recipe), {"params": {**defaults, "resource_profile": profile}})
        assert {s.name: s.step_id for s in pipe.graph} == base, profile
    pipe = pipeline_for_run(str(gke_recipe), {"params": {**defaults, "resource_profile": "gpu-h100-8"}})
    assert pipe.recipe.train.resources.accelerator.count == 8


def test_the_operator_resolves_ids_at_run_time_and_dry_run_computes_nothing(dag, recipe):
    from airflow.sdk.definitions.param import ParamsDict

    from tidal.core.load import load_pipeline

    defaults = ParamsDict(dag.params).validate()
    train = dag.get_task("train")
    parse_time_id = load_pipeline(recipe).graph["train"].step_id
    assert parse_time_id in train.doc_md
    out = train.execute({"params": {**defaults, "train_steps": 7, "dry_run": True}})
    assert out["status"] == "dry-run:blocked"
    assert out["step_id"] != parse_time_id
    assert out["step_id"] == load_pipeline(recipe, {"train.steps": 7}).graph["train"].step_id
    fetch = dag.get_task("fetch-brown").execute({"params": {**defaults, "dry_run": True}})
    assert fetch["status"] == "dry-run:run"
    assert not load_pipeline(recipe).storage.is_committed(fetch["step_id"])


def test_dag_docs_show_the_description_and_the_step_graph(dag, recipe):
    from tidal.core.load import load_pipeline

    pipe = load_pipeline(recipe)
    assert pipe.recipe.description in dag.doc_md
    for step in pipe.graph:
        assert f"| `{step.name}` | {step.kind} | `{step.step_id}` |" in dag.doc_md
    assert "| `train` | train |" in dag.doc_md and "`gate`" in dag.doc_md.split("| `train` |")[1]
