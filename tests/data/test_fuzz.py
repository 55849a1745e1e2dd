"""Fuzz tests (hypothesis, a bounded number of cases): hostile files never reach the user as a traceback.

- The JSONL, Parquet and text readers: every line or row of a generated file (random JSON values,
  deep nesting, raw bytes, invalid UTF-8, a byte-order mark, CRLF, compressed and truncated streams,
  random Parquet columns and corrupt files) is a record, a quarantine record with a known reason, or
  counted as skipped: nothing raises, nothing is lost silently.
- The recipe loader through ``tidal plan``: mutated recipes (random values at random fields), random
  text and YAML with anchors, tags and aliases exit 0 or 2 with one ``error:`` line, never a traceback.

Each test runs ``FUZZ_CASES`` cases (derandomized: the same cases on every run, so CI is stable) and
prints its count and slowest case.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import time
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TINY
from tidal.data.readers import READ_REASONS, read_path
from tidal.data.record_fields import SourceError

FUZZ_CASES = 300
FUZZ = settings(max_examples=FUZZ_CASES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)


@st.composite
def jsonl_line(draw) -> bytes:
    kind = draw(st.sampled_from(["record", "value", "bytes", "deep", "blank", "bom"]))
    if kind == "record":
        obj = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=4))
        if draw(st.booleans()):
            obj["text"] = draw(json_values | st.text(max_size=200))
        line = json.dumps(obj, allow_nan=True, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    elif kind == "value":
        line = json.dumps(draw(json_values)).encode()
    elif kind == "bytes":
        line = draw(st.binary(max_size=120))
    elif kind == "deep":
        depth = draw(st.integers(1, 200_000))
        line = b"[" * depth + b"]" * draw(st.integers(0, depth)) if draw(st.booleans()) else b'{"a":' * depth
    elif kind == "blank":
        line = draw(st.sampled_from([b"", b"   ", b"\t", b"\r"]))
    else:
        line = b"\xef\xbb\xbf" + json.dumps({"text": draw(st.text(max_size=30))}).encode()
    if draw(st.booleans()):
        line += b"\r"
    return line.replace(b"\n", b" ")


class Slowest:
    """The number of cases a test ran and its slowest one (seconds), printed at the end."""

    def __init__(self) -> None:
        self.cases, self.worst, self.what = 0, 0.0, ""

    @contextlib.contextmanager
    def case(self, what: str):
        started = time.perf_counter()
        yield
        took = time.perf_counter() - started
        self.cases += 1
        if took > self.worst:
            self.worst, self.what = took, what

    def report(self, name: str) -> None:
        print(f"FUZZ {name}: {self.cases} cases, slowest {self.worst:.3f} s ({self.what})")


def _object(line: bytes, first: bool):
    """The JSON value of a fuzzed line as the reader parses it (a BOM dropped from the first line
    only; ``None`` if it is not JSON)."""
    try:
        line = line.removeprefix(b"\xef\xbb\xbf") if first else line
        return json.loads(line.decode("utf-8", errors="surrogateescape"))
    except (ValueError, RecursionError):
        return None


def check_records(records, path_name: str) -> None:
    for record in records:
        assert record.reason is None or record.reason in READ_REASONS, record
        if record.reason is not None:
            assert path_name in record.detail and "\n" not in record.detail, record.detail


@pytest.fixture(scope="module")
def timing():
    stats: dict[str, Slowest] = {}
    yield stats
    for name, slowest in stats.items():
        slowest.report(name)


def test_the_jsonl_reader_accounts_for_every_line(tmp_path_factory, timing):
    slowest = timing.setdefault("jsonl", Slowest())

    @FUZZ
    @given(lines=st.lists(jsonl_line(), max_size=12), codec=st.sampled_from(["plain", "gz", "gz-truncated"]))
    def case(lines, codec):
        folder = tmp_path_factory.mktemp("jsonl")
        data = b"\n".join(lines) + (b"\n" if lines else b"")
        name = "in.jsonl" + (".gz" if codec.startswith("gz") else "")
        if codec.startswith("gz"):
            data = gzip.compress(data, mtime=0)
            if codec == "gz-truncated":
                data = data[: max(len(data) // 2, 1)]
        (folder / name).write_bytes(data)
        skipped: Counter = Counter()
        with slowest.case(f"{len(lines)} lines, {codec}, {len(data)} bytes"):
            try:
                records = list(read_path("jsonl", folder, "text", skipped))
            except SourceError as err:  # no object of the file has "text": the recipe names the wrong field
                assert "has the field 'text'" in str(err) and name in str(err)
                if codec != "gz-truncated":  # every line was read: an object, and none with the field
                    objects = [o for n, line in enumerate(lines) if isinstance(o := _object(line, n == 0), dict)]
                    assert objects and not any("text" in o for o in objects), lines
                return
        check_records(records, name)
        if codec == "gz-truncated" and records and records[-1].reason == "truncated_file":
            return  # the lines before the truncation are kept; the rest is one quarantine record
        if codec != "gz-truncated":
            blank = sum(1 for line in lines if not line.strip() or line.strip() == b"\xef\xbb\xbf")
            assert len(records) + skipped["blank_line"] == len(lines), (lines, records, skipped)
            assert skipped["blank_line"] >= blank - 1  # a BOM-only first line is blank too
            if not any(line.strip() for line in lines):
                assert skipped["empty_file"] == 1

    case()


@st.composite
def parquet_bytes(draw) -> bytes:
    if draw(st.integers(0, 4)) == 0:  # not a Parquet file at all, or a damaged one
        return draw(st.binary(max_size=300)) if draw(st.booleans()) else b"PAR1" + draw(st.binary(max_size=200))
    n = draw(st.integers(0, 6))
    column = draw(st.sampled_from(["text", "body"]))
    typ = draw(st.sampled_from(["string", "binary", "int", "struct", "list"]))
    values = {
        "string": st.lists(st.none() | st.text(max_size=50), min_size=n, max_size=n),
        "binary": st.lists(st.none() | st.binary(max_size=50), min_size=n, max_size=n),
        "int": st.lists(st.none() | st.integers(-2**63, 2**63 - 1), min_size=n, max_size=n),
        "struct": st.lists(st.none() | st.fixed_dictionaries({"a": st.integers(0, 9)}), min_size=n, max_size=n),
        "list": st.lists(st.none() | st.lists(st.text(max_size=5), max_size=3), min_size=n, max_size=n),
    }[typ]
    table = pa.table({column: pa.array(draw(values)), "extra": pa.array(list(range(n)))})
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=draw(st.integers(1, 4)))
    data = out.getvalue()
    if draw(st.integers(0, 3)) == 0:  # a truncated copy
        data = data[: draw(st.integers(0, len(data)))]
    return data


def test_the_parquet_and_text_readers_quarantine_instead_of_raising(tmp_path_factory, timing):
    slowest = timing.setdefault("parquet+text", Slowest())

    @FUZZ
    @given(data=parquet_bytes(), text=st.binary(max_size=200))
    def case(data, text):
        folder = tmp_path_factory.mktemp("pq")
        (folder / "in.parquet").write_bytes(data)
        with slowest.case(f"parquet of {len(data)} bytes"):
            try:
                records = list(read_path("parquet", folder / "in.parquet", "text", Counter()))
            except SourceError as err:  # a readable file without the column: the recipe names the wrong one
                assert "text" not in pq.ParquetFile(folder / "in.parquet").schema_arrow.names, err
                records = []
        check_records(records, "in.parquet")
        (folder / "doc.txt").write_bytes(text)
        skipped: Counter = Counter()
        docs = list(read_path("text", folder / "doc.txt", "text", skipped))
        assert (docs == [] and skipped["empty_file"] == 1) if not text else [d.raw for d in docs] == [text]

    case()


@st.composite
def hostile_recipe(draw) -> str:
    base = yaml.safe_load(TINY.read_text())
    kind = draw(st.sampled_from(["mutate", "mutate", "text", "yaml-features"]))
    if kind == "text":
        return draw(st.text(max_size=300))
    if kind == "yaml-features":
        snippet = draw(st.sampled_from([
            "a: &x [1, 2]\nb: *x\n", "name: !!python/object:os.system ls\n", "!!binary aGVsbG8=\n",
            "name: tiny\nname: other\n", "? [a, b]\n: c\n", "x: " + "[" * 500 + "]" * 500 + "\n",
            "name: " + "y" * 5000 + "\n", "--- a\n--- b\n", "%YAML 1.1\n---\nname: x\n"]))
        return snippet + (draw(st.text(max_size=40)) if draw(st.booleans()) else "")
    data = base
    for _ in range(draw(st.integers(1, 3))):  # random values at random paths of the real recipe
        node, path = data, []
        while isinstance(node, dict) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node, key=str)))
            path.append(key)
            if not isinstance(node[key], dict):
                break
            node = node[key]
        if isinstance(node, dict):
            key = path[-1] if path and path[-1] in node else draw(st.sampled_from(sorted(node, key=str) + ["zz"]))
            node[key] = draw(json_values | st.text(max_size=30))
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def test_the_recipe_loader_answers_hostile_recipes_with_one_error_line(tmp_path_factory, timing):
    from tidal.cli import main

    slowest = timing.setdefault("recipe", Slowest())

    @FUZZ
    @given(text=hostile_recipe())
    def case(text):
        folder = tmp_path_factory.mktemp("recipe")
        recipe = folder / "r.yaml"
        recipe.write_text(text, encoding="utf-8", errors="surrogatepass")
        out, err = io.StringIO(), io.StringIO()
        with slowest.case(f"{len(text)} characters"), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["plan", str(recipe), "--storage-root", str(folder / "root")])
        assert code in (0, 2), (code, text[:300], err.getvalue()[-2000:])
        errors = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
        if code == 2:
            assert len(errors) == 1 and "Traceback" not in err.getvalue(), err.getvalue()[-2000:]
            assert len(errors[0]) < 20_000  # an echoed value is truncated, not megabytes

    case()

