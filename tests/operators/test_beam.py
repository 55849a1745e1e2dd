"""Beam steps through the Beam provider (`beam.launcher: provider`): the recipe section never
changes a step id, the DAG variant parses light and renders the provider operator's
arguments, and one real clean job run by the provider's own hook, then committed, gives the
same bytes (manifest root hash) and summary as the in-process step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest
import yaml

from operators.dag_factory import build_dag
from operators.remote import ProviderOperator
from tests.conftest import REPO, seal
from tidal.core.planner import build_graph
from tidal.recipe import BEAM_RUNNERS, RecipeError, parse_recipe

DATAFLOW = {"launcher": "provider", "runner": "DataflowRunner",
            "pipeline_options": {"project": "my-project", "region": "europe-west4", "temp_location": "gs://b/tmp",
                                 "sdk_container_image": "REGISTRY/tidal-beam:TAG", "max_num_workers": 8,
                                 "experiments": ["use_runner_v2", "enable_prime"]}}  # a list: a repeated option
FLINK = {"launcher": "provider", "runner": "FlinkRunner",
         "pipeline_options": {"flink_master": "flink-jobmanager:8081", "environment_type": "LOOPBACK"}}
PREPARED = {"status": "run", "out": "/store/.scratch/x", "config": "/store/.scratch/x.job/config.json",
            "inputs": {"fetch-brown": "/store/fetch-brown-1", "clean-udhr": "/store/clean-udhr-2",
                       "tokenizer": "/store/tokenizer-3"}}


def write_recipe(tmp_path: Path, data: dict, name: str, beam: dict | None, **extra) -> Path:
    data = {**data, "name": name, **extra}
    if beam is not None:
        data["beam"] = beam
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class StubTI:
    """Just enough of a task instance for Jinja and the provider: the prepare task's XCom."""

    def __init__(self, prepared: dict) -> None:
        self.prepared = prepared

    def xcom_pull(self, task_ids=None, key=None):
        assert task_ids.endswith(".prepare") and key == "prepared"
        return self.prepared

    def xcom_push(self, key, value):
        pass


def rendered(op: ProviderOperator, prepared: dict = PREPARED) -> dict:
    op.render_template_fields({"ti": StubTI(prepared)})
    return op.operator_kwargs


def test_beam_section_never_changes_step_ids(tiny_data):
    ids = [{s.name: s.step_id for s in build_graph(parse_recipe({**tiny_data, **({"beam": b} if b else {})}))}
           for b in (None, {"launcher": "inprocess"}, DATAFLOW, FLINK)]
    assert all(i == ids[0] for i in ids)
    assert all("beam" not in json.dumps(s.hash_input) for s in build_graph(parse_recipe({**tiny_data, "beam": FLINK})))


def test_recipe_refuses_unknown_runners_and_reserved_options(tiny_data):
    with pytest.raises(RecipeError, match=r"beam\.runner: unknown Beam runner 'DataFlowRunner'; valid: FnApiRunner, "
                                          r"DirectRunner") as err:
        parse_recipe({**tiny_data, "beam": {**DATAFLOW, "runner": "DataFlowRunner"}})
    assert all(r in str(err.value) for r in BEAM_RUNNERS)
    with pytest.raises(RecipeError, match="pipeline option 'out' is set by tidal"):
        parse_recipe({**tiny_data, "beam": {**FLINK, "pipeline_options": {"out": "/x"}}})
    with pytest.raises(RecipeError, match="write the bare name"):
        parse_recipe({**tiny_data, "beam": {**FLINK, "pipeline_options": {"--runner": "x"}}})
    with pytest.raises(RecipeError, match=r"apply to `launcher: provider`.*TIDAL_BEAM_ARGS"):
        parse_recipe({**tiny_data, "beam": {"runner": "FlinkRunner"}})
    with pytest.raises(RecipeError, match="beam.launcher"):
        parse_recipe({**tiny_data, "beam": {"launcher": "dataflow"}})


PROBE = r"""
import sys, time, runpy
import airflow.sdk
started = time.perf_counter()
ns = runpy.run_path("dags/pretrain.py")
print(time.perf_counter() - started)
print(",".join(m for m in ("apache_beam", "airflow.providers.apache.beam.operators.beam", "airflow.providers.google")
               if m in sys.modules))
print(",".join(sorted(t.task_id for t in ns["tidal_df"].tasks if t.task_id.startswith("clean-brown"))))
print(",".join(sorted(t.task_id for t in ns["tidal_local"].tasks if t.task_id.startswith("clean-brown"))))
"""


def test_same_dag_file_parses_both_variants_light(tmp_path, tiny_data):
    write_recipe(tmp_path, tiny_data, "df", DATAFLOW)
    write_recipe(tmp_path, tiny_data, "local", None)
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120,
                         check=True, env={**os.environ, "TIDAL_RECIPES_DIR": str(tmp_path)})
    elapsed, heavy, provider_tasks, local_tasks = out.stdout.strip().splitlines()[-4:]
    # what keeps a parse light is that Beam and the Google provider are not imported (its seconds under a loaded
    # CI machine are no measure; bench/dag_parse.py times it)
    assert heavy == "" and float(elapsed) > 0
    assert provider_tasks == "clean-brown.commit,clean-brown.launch,clean-brown.prepare"
    assert local_tasks == "clean-brown"


def test_dataflow_variant_renders_the_provider_operator_arguments(tmp_path, tiny_data):
    dag = build_dag(write_recipe(tmp_path, tiny_data, "df", DATAFLOW))
    graph = build_graph(parse_recipe({**tiny_data, "beam": DATAFLOW}))
    for name in ("clean-brown", "tokenize-udhr"):
        prepare, launch, commit = (dag.task_dict[f"{name}.{t}"] for t in ("prepare", "launch", "commit"))
        assert type(prepare).__name__ == "BeamPrepareOperator" and launch.upstream_task_ids == {f"{name}.prepare"}
        assert commit.upstream_task_ids == {f"{name}.prepare", f"{name}.launch"}
        assert commit.trigger_rule == "none_failed_min_one_success"
        assert isinstance(launch, ProviderOperator)
        assert launch.provider_class == "operators.beam_provider:BeamRunPythonPipelineOperator"
    assert dag.task_dict["clean-brown.prepare"].upstream_task_ids == {"fetch-brown", "plan"}
    assert dag.task_dict["tokenize-udhr.prepare"].upstream_task_ids == {"clean-udhr.commit", "plan", "tokenizer"}
    assert dag.task_dict["tokenizer"].upstream_task_ids == {"clean-brown.commit", "clean-gcide.commit",
                                                            "clean-songci.commit", "plan"}
    assert type(dag.task_dict["mix"]).__name__ == "TidalStepOperator"  # only Beam kinds change

    step = graph["tokenize-udhr"]
    kwargs = rendered(dag.task_dict["tokenize-udhr.launch"])
    assert kwargs["py_file"] == "tidal.data.tokenize" and kwargs["py_options"] == ["-m"]
    assert kwargs["py_interpreter"] == sys.executable
    assert kwargs["runner"] == "DataflowRunner" and kwargs["deferrable"] is True
    assert kwargs["default_pipeline_options"] == DATAFLOW["pipeline_options"]
    job = kwargs["pipeline_options"]
    assert job["config"] == PREPARED["config"] and job["out"] == PREPARED["out"]
    assert job["input"] == ["clean-udhr=/store/clean-udhr-2", "tokenizer=/store/tokenizer-3"]
    assert job["name"] == "tokenize-udhr" and "seed" not in job  # tokenize draws no random numbers
    assert job["labels"] == {"tidal-recipe": "df", "tidal-step": "tokenize-udhr", "tidal-step-id": step.step_id}
    assert kwargs["dataflow_config"] == {"job_name": f"tidal-{step.step_id}", "project_id": "my-project",
                                         "location": "europe-west4"}
    try:
        import airflow.providers.google  # noqa: F401
    except ImportError:  # the lock has no Google provider: Dataflow is refused by name on the worker
        from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException

        with pytest.raises(AirflowOptionalProviderFeatureException, match="apache-airflow-providers-google"):
            dag.task_dict["tokenize-udhr.launch"].build()
    else:
        op = dag.task_dict["tokenize-udhr.launch"].build()
        assert op.runner == "DataflowRunner" and op.deferrable


def test_flink_variant_builds_the_real_operator_and_its_command(tmp_path, tiny_data, monkeypatch):
    from airflow.providers.apache.beam.hooks import beam as beam_hooks
    from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator

    dag = build_dag(write_recipe(tmp_path, tiny_data, "flink", FLINK))
    shell = dag.task_dict["clean-brown.launch"]
    rendered(shell)
    op = shell.build()
    assert isinstance(op, BeamRunPythonPipelineOperator) and not op.deferrable and op.runner == "FlinkRunner"
    commands = []
    monkeypatch.setattr(beam_hooks, "run_beam_command", lambda cmd, **kw: commands.append(cmd))
    monkeypatch.setattr(beam_hooks.subprocess, "check_output", lambda *a, **kw: b"2.77.0")
    op.execute({"ti": StubTI(PREPARED)})
    from airflow.version import version as airflow_version

    from tidal.core.commit import make_context
    from tidal.storage import LocalStorage

    step = build_graph(parse_recipe(tiny_data))["clean-brown"]
    assert make_context(step, LocalStorage(tmp_path), tmp_path).seed is None  # clean draws no random numbers
    assert commands[0][:3] == [sys.executable, "-m", "tidal.data.clean"]
    assert commands[0][3] == "--runner=FlinkRunner"
    assert set(commands[0][4:]) == {
        "--flink_master=flink-jobmanager:8081", "--environment_type=LOOPBACK", f"--config={PREPARED['config']}",
        "--input=fetch-brown=/store/fetch-brown-1", f"--out={PREPARED['out']}",
        "--name=clean-brown", "--labels=tidal-recipe=flink", "--labels=tidal-step=clean-brown",
        f"--labels=tidal-step-id={step.step_id}", f"--labels=airflow-version=v{airflow_version.replace('.', '-')}"}


def test_local_launcher_is_unchanged(tmp_path, tiny_data):
    dag = build_dag(write_recipe(tmp_path, tiny_data, "plain", None))
    assert type(dag.task_dict["clean-brown"]).__name__ == "TidalStepOperator"
    assert not any(t.startswith("clean-brown.") for t in dag.task_dict)


# --- one real job through the provider's hook, committed, against the in-process step ---

DOCS = [f"Document number {i} talks about rivers, hills and the weather in plain words." for i in range(40)]


def fake_fetch(pipe, name: str) -> None:
    """Commit a small raw.parquet as the fetch step (what `fetch` writes, without the archive)."""
    from tidal.data import fetch

    step = pipe.graph[name]
    out = pipe.storage.step_dir(step.step_id)
    out.mkdir(parents=True)
    raws = [d.encode() for d in DOCS] + [DOCS[0].encode(), b"short", b"bad \x92 utf8 but long enough to count"]
    table = pa.table({"source": ["brown"] * len(raws), "ref": [f"ca{i:02d}" for i in range(len(raws))],
                      "raw": pa.array(raws, pa.binary())}, schema=fetch.RAW_SCHEMA)
    fetch.write_parquet(table, out / fetch.RAW_FILE)
    seal(out)


def test_provider_job_commits_the_same_bytes_as_in_process(tmp_path, tiny_data):
    from tidal.core.beam_job import JobIncomplete, commit, job_dir, prepare
    from tidal.core.commit import read_step_json
    from tidal.core.load import load_pipeline

    tiny_data["sources"]["brown"].pop("filters", None)  # DOCS are one-line: brown's C4/Gopher would filter all
    local = load_pipeline(write_recipe(tmp_path, tiny_data, "inproc", None), storage_root=str(tmp_path / "a"))
    path = write_recipe(tmp_path, tiny_data, "prov", {"launcher": "provider", "runner": "FnApiRunner"})
    remote = load_pipeline(path, storage_root=str(tmp_path / "b"))
    for pipe in (local, remote):
        fake_fetch(pipe, "fetch-brown")
    expected = local.run("clean-brown")

    prepared = prepare(remote, "clean-brown")
    work = Path(prepared["out"])
    assert prepared["status"] == "run" and work.parent.name == ".scratch" and not any(work.iterdir())
    assert json.loads(Path(prepared["config"]).read_text()) == json.loads(json.dumps(dict(
        remote.graph["clean-brown"].config)))
    with pytest.raises(JobIncomplete, match="counts.json"):
        commit(remote, "clean-brown", prepared=prepared, runner="FnApiRunner")

    dag = build_dag(path)
    shell = dag.task_dict["clean-brown.launch"]
    rendered(shell, prepared)
    shell.build().execute({"ti": StubTI(prepared)})  # the provider's BeamHook runs `python -m tidal.data.clean`

    result = commit(remote, "clean-brown", prepared=prepared, runner="FnApiRunner", workload="w")
    assert result.status == "run" and result.step_id == expected.step_id
    assert remote.storage.is_committed(result.step_id) and not work.exists() and not job_dir(work).exists()
    got, want = read_step_json(result.out_dir), read_step_json(expected.out_dir)
    assert got["manifest_root_hash"] == want["manifest_root_hash"]
    assert got["summary"] == want["summary"] == expected.summary and got["summary"]["duplicates"] == 1
    assert got["provenance"]["launcher"] == "beam-provider" and got["provenance"]["runner"] == "FnApiRunner"
    assert (result.out_dir / "manifest.json").read_bytes() == (expected.out_dir / "manifest.json").read_bytes()
    assert prepare(remote, "clean-brown")["status"] == "skip"
    assert commit(remote, "clean-brown", prepared={"status": "skip"}, runner="FnApiRunner").status == "skip"


# --- tidal.data.jobcli: pipeline options, usage name, missing config ---

def fake_job(tmp_path: Path, name: str = "tidal.data.clean") -> ModuleType:
    import importlib.machinery

    module = ModuleType("__main__", "a fake job")
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.seen = []
    module.run = lambda ctx: module.seen.append((ctx, os.environ.get("TIDAL_BEAM_ARGS"))) or {"ok": 1}
    return module


# the smallest configs the clean and mix models accept (a job parses its config once, into the model)
CLEAN_CONFIG = '{"source": "x", "input": "fetch-x"}'
MIX_CONFIG = '{"seed": 1, "weights": {"x": 1.0}, "inputs": {"x": "tokenize-x"}, "n_sequences": 4, "shards": 1}'


def test_jobcli_forwards_unknown_options_to_beam(tmp_path, monkeypatch):
    from tidal.data.clean import CleanConfig
    from tidal.data.jobcli import main

    monkeypatch.setenv("TIDAL_BEAM_ARGS", "--direct_num_workers=2")
    module = fake_job(tmp_path)
    main(module, "clean", [f"--config={CLEAN_CONFIG}", "--input=fetch-x=/d", f"--out={tmp_path}/o",
                           "--runner=FlinkRunner", "--labels=a=b"])
    ctx, beam_args = module.seen[0]
    assert beam_args == "--direct_num_workers=2 --runner=FlinkRunner --labels=a=b"
    assert ctx.inputs == {"fetch-x": Path("/d")} and ctx.seed is None
    assert ctx.config == CleanConfig(source="x", input="fetch-x")  # the model, parsed once from the JSON
    assert os.environ["TIDAL_BEAM_ARGS"] == "--direct_num_workers=2"  # restored
    with pytest.raises(SystemExit):
        main(fake_job(tmp_path, "tidal.data.mix"), "mix", ["--config={}", f"--out={tmp_path}/o", "--runner=X"])


def test_jobcli_usage_names_the_module_and_a_missing_config_file(tmp_path, capsys):
    from tidal.data.jobcli import main

    with pytest.raises(SystemExit):
        main(fake_job(tmp_path), "clean", ["--config", str(tmp_path / "nope.json"), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert err.startswith("error: python -m tidal.data.clean: --config ") and "nope.json: file not found" in err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "c.json").write_text(CLEAN_CONFIG)
    module = fake_job(tmp_path)
    main(module, "clean", ["--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "o")])
    assert module.seen[0][0].config.source == "x" and module.seen[0][1] is None
    (tmp_path / "c.json").write_text('{"source": "x", "input": "fetch-x", "a": 1}')
    with pytest.raises(SystemExit):
        main(module, "clean", ["--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert "--config: 1 problem(s) for CleanConfig: a: unknown key" in err and len(err.strip().splitlines()) == 1


def test_jobcli_requires_the_seed_of_a_seeded_kind_and_refuses_it_elsewhere(tmp_path, capsys):
    from tidal.data.jobcli import main

    module = fake_job(tmp_path)
    with pytest.raises(SystemExit):
        main(module, "mix", ["--config={}", f"--out={tmp_path}/o"])
    assert "--seed is required: a mix step draws random numbers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(module, "clean", ["--config={}", f"--out={tmp_path}/o", "--seed=3"])
    assert "--seed: a clean step draws no random numbers" in capsys.readouterr().err
    main(module, "mix", [f"--config={MIX_CONFIG}", f"--out={tmp_path}/o", "--seed=3"])
    assert module.seen[-1][0].seed == 3


def test_jobcli_names_a_missing_input_in_one_line(tmp_path, capsys):
    from tidal.data.jobcli import main

    module = fake_job(tmp_path)
    module.run = lambda ctx: ctx.input_dir("fetch-brown")
    with pytest.raises(SystemExit) as exit_info:
        main(module, "clean", [f"--config={CLEAN_CONFIG}", f"--out={tmp_path}/o"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: python -m tidal.data.clean: ")
    assert "step 'clean' has no input 'fetch-brown'; its inputs are [] (give each as --input NAME=DIR)" in err
    with pytest.raises(SystemExit):
        main(module, "mix", ["--config={}", f"--out={tmp_path}/o", "--seed=-5"])
    assert "a step seed is an integer >= 0, got -5" in capsys.readouterr().err
