"""Bringing your own files (issue 21 items 2, 3, 14): a relative source path is read from the
recipe's directory and must exist, a text field or kept field the files lack fails fetch naming
the file and what it has, and records keep their own id and chosen fields through fetch and clean."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.data.test_recipe_data import with_source
from tidal.context import StepContext
from tidal.data import clean, fetch
from tidal.data.normalize import document_id
from tidal.data.record_fields import SourceError

LONG = "The miller carried six sacks of grain across the old stone bridge before noon"
OTHER = "Harbour lanterns glowed while the merchants counted silver coins and bolts of cloth"
DECOY = "A decoy document that lives beside the current directory and must never be read"


def tidal(cwd, *args):
    """``python -m tidal ARGS`` run from ``cwd``."""
    return subprocess.run([sys.executable, "-m", "tidal", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, check=False, timeout=300)


def one_error_line(result, *needles):
    """The command failed with exactly one ``error:`` line holding every needle, no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write_recipe(folder, tiny_data, **source):
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(with_source(tiny_data, "web", {"format": "jsonl", "licence": "CC0-1.0",
                                                                    **source})))
    return recipe


def fetch_ids(plan_stdout: str) -> set[str]:
    return {word for word in plan_stdout.split() if word.startswith("fetch-web-")}


# ---------------------------------------------------------------- item 2: the path


def test_a_relative_path_is_read_from_the_recipe_directory_whatever_the_cwd(tiny_data, tmp_path):
    project, other = tmp_path / "project", tmp_path / "other"
    (project / "data").mkdir(parents=True)
    (other / "data").mkdir(parents=True)
    (project / "data" / "web.jsonl").write_text(json.dumps({"text": LONG}) + "\n")
    (other / "data" / "web.jsonl").write_text(json.dumps({"text": DECOY}) + "\n")  # same relative name
    write_recipe(project, tiny_data, path="data/web.jsonl")
    plans = [tidal(cwd, "plan", recipe) for cwd, recipe in ((tmp_path, "project/recipe.yaml"),
                                                             (other, "../project/recipe.yaml"))]
    assert all(p.returncode == 0 for p in plans), [p.stderr[-2000:] for p in plans]
    assert len(fetch_ids(plans[0].stdout)) == 1 and fetch_ids(plans[0].stdout) == fetch_ids(plans[1].stdout)
    raws = []
    for n, (cwd, recipe) in enumerate(((tmp_path, "project/recipe.yaml"), (other, "../project/recipe.yaml"))):
        root = tmp_path / f"store{n}"
        run = tidal(cwd, "run", recipe, "--step", "fetch-web", "--storage-root", root)
        assert run.returncode == 0, run.stderr[-3000:]
        (step_dir,) = root.glob("fetch-web-*/")
        assert step_dir.name in fetch_ids(plans[0].stdout)
        raws.append(pq.read_table(step_dir / fetch.RAW_FILE).column("raw").to_pylist())
    assert raws == [[LONG.encode()], [LONG.encode()]]


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_missing_path_is_one_error_line_naming_recipe_and_field(tiny_data, tmp_path, command):
    recipe = write_recipe(tmp_path, tiny_data, path="data/missing.jsonl")
    result = tidal(tmp_path, command, recipe, "--storage-root", tmp_path / "store")
    one_error_line(result, str(recipe), "sources.web.path", str(tmp_path / "data" / "missing.jsonl"))
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").glob("fetch-web-*"))


def test_a_path_gone_since_planning_fails_fetch_naming_the_field(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    config = {"source": "web", "format": "jsonl", "path": str(tmp_path / "gone"), "snapshot_sha256": "a" * 64}
    with pytest.raises(SourceError, match=r"sources\.web\.path: source path .*gone does not exist"):
        fetch.run(StepContext("fetch-web-1", "fetch-web", "fetch", config, out))
    assert list(out.iterdir()) == []


# ---------------------------------------------------------------- item 3: the text field


def run_fetch(tmp_path, path, fmt, **extra):
    out = tmp_path / f"fetch-{fmt}-{len(list(tmp_path.glob('fetch-*')))}"
    out.mkdir()
    config = {"source": "web", "format": fmt, "path": str(path), **extra}
    return fetch.run(StepContext("fetch-web-1", "fetch-web", "fetch", config, out)), out


def test_a_parquet_file_without_the_text_column_fails_fetch_naming_its_columns(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    pq.write_table(pa.table({"body": [LONG, OTHER], "id": ["a", "b"]}), src / "part-0.parquet")
    with pytest.raises(SourceError) as err:
        run_fetch(tmp_path, src, "parquet", text_field="text")
    assert str(err.value) == ("sources.web.text_field: part-0.parquet has no column 'text' "
                              "(its columns: body, id)")
    assert not list((tmp_path / "fetch-parquet-0").iterdir())  # nothing written, nothing to commit
    assert run_fetch(tmp_path, src, "parquet", text_field="body")[0]["documents"] == 2


def test_a_jsonl_file_where_no_record_has_the_field_fails_fetch(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"text": LONG}) + "\n")  # this file is fine
    (src / "b.jsonl").write_text("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate([LONG, OTHER])))
    with pytest.raises(SourceError) as err:
        run_fetch(tmp_path, src, "jsonl")
    assert str(err.value).startswith("sources.web.text_field: no record of b.jsonl has the field 'text' "
                                     "(2 JSON object(s) read; the first 2 have: body, id)")
    with pytest.raises(SourceError, match="sources.web.text_field: no record of a.jsonl has the field 'body'"):
        run_fetch(tmp_path, src / "a.jsonl", "jsonl", text_field="body", max_documents=1)  # stopped early too


def test_tidal_run_with_a_wrong_text_field_prints_one_error_line(tiny_data, tmp_path):
    pq.write_table(pa.table({"content": [LONG]}), tmp_path / "web.parquet")
    recipe = write_recipe(tmp_path, tiny_data, format="parquet", path="web.parquet")
    result = tidal(tmp_path, "run", recipe, "--step", "fetch-web", "--storage-root", tmp_path / "store")
    one_error_line(result, "sources.web.text_field", "web.parquet has no column 'text'", "content")
    # item 12: a failed `tidal run` step is in the failure catalog, as an Airflow task's failure is
    from tidal.storage.base import LocalStorage
    from tidal.tracking.failures import list_failures

    [record] = list_failures(LocalStorage(tmp_path / "store"))
    assert (record["task_id"], record["launcher"], record["dag_id"]) == ("fetch-web", "cli", "tidal-run")
    assert "web.parquet has no column 'text'" in record["message"]


# ---------------------------------------------------------------- item 14: own ids and fields


def own_corpus(tmp_path, fmt):
    """Records with the user's id and url: two survivors, an exact duplicate, a too-short one,
    and (JSONL) a record without text and a malformed line."""
    rows = [{"id": "u-1", "url": "https://a.example/1", "text": LONG, "lang": "en"},
            {"id": "u-2", "url": "https://a.example/2", "text": OTHER, "lang": "en"},
            {"id": "u-3", "url": "https://a.example/3", "text": LONG, "lang": "en"},  # exact duplicate of u-1
            {"id": "u-4", "url": "https://a.example/4", "text": "too short", "lang": "en"}]
    src = tmp_path / f"own-{fmt}"
    src.mkdir()
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), src / "own.parquet")
    else:
        lines = [json.dumps(r) for r in rows] + [json.dumps({"id": "u-5", "url": "https://a.example/5"}), "{oops"]
        (src / "own.jsonl").write_text("\n".join(lines) + "\n")
    return src


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_records_keep_their_id_and_url_through_fetch_and_clean(tmp_path, fmt):
    src = own_corpus(tmp_path, fmt)
    _, fetch_out = run_fetch(tmp_path, src, fmt, keep_fields=["url"])
    out = tmp_path / "clean"
    out.mkdir()
    clean.run(StepContext("c", "clean-web", "clean", {"source": "web", "input": "fetch-web", "shards": 2}, out,
                          inputs={"fetch-web": fetch_out}))
    docs = [r for k in range(2) for r in pq.read_table(out / clean.shard_name(k, 2)).to_pylist()]
    own = {json.loads(d["fields"])["id"]: d for d in docs}
    assert sorted(own) == ["u-1", "u-2"]
    assert json.loads(own["u-1"]["fields"]) == {"id": "u-1", "url": "https://a.example/1"}  # not `lang`
    assert own["u-1"]["text"] == LONG and own["u-1"]["id"] == document_id(LONG)  # text and tidal's id as before
    removed = {json.loads(r["fields"])["id"]: r for r in pq.read_table(out / clean.REMOVED_FILE).to_pylist()}
    assert (removed["u-3"]["outcome"], removed["u-3"]["reason"], removed["u-3"]["cluster"]) == (
        "duplicate", "exact", document_id(LONG))
    assert json.loads(removed["u-4"]["fields"]) == {"id": "u-4", "url": "https://a.example/4"}
    assert removed["u-4"]["reason"] == "too_short"
    if fmt == "jsonl":
        quarantined = {r["ref"]: r for r in pq.read_table(out / clean.QUARANTINE_FILE).to_pylist()}
        assert json.loads(quarantined["own.jsonl:5"]["fields"]) == {"id": "u-5", "url": "https://a.example/5"}
        assert quarantined["own.jsonl:6"]["fields"] is None  # malformed JSON: no field to read


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_missing_keep_field_or_named_id_field_fails_fetch(tmp_path, fmt):
    src = own_corpus(tmp_path, fmt)
    where = "no column 'source_url'" if fmt == "parquet" else "no record of own.jsonl has the field 'source_url'"
    with pytest.raises(SourceError, match=f"sources.web.keep_fields: .*{where}"):
        run_fetch(tmp_path, src, fmt, keep_fields=["url", "source_url"])
    with pytest.raises(SourceError, match="sources.web.id_field: .*doc_key"):
        run_fetch(tmp_path, src, fmt, id_field="doc_key")


def test_a_source_without_ids_keeps_no_fields(tmp_path):
    src = tmp_path / "plain"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"text": LONG, "url": "https://a.example/1"}) + "\n")
    _, out = run_fetch(tmp_path, src, "jsonl")  # no `id` and no keep_fields: nothing kept
    assert pq.read_table(out / fetch.RAW_FILE).column("fields").to_pylist() == [None]
