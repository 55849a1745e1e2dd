"""File readers: JSONL (plain, .gz, .zst), Parquet and text; every bad record quarantined, the rest read."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tidal.data.readers import list_files, read_path
from tidal.data.snapshot import snapshot_sha256


def jsonl(*objs) -> bytes:
    return b"".join((o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n" for o in objs)


def records(fmt, path, **kw):
    skipped: Counter = Counter()
    out = [(r.ref, r.raw, r.reason) for r in read_path(fmt, path, skipped=skipped, **kw)]
    return out, skipped


def test_jsonl_plain_gz_zst_read_the_same_records(tmp_path):
    data = jsonl({"text": "first doc"}, {"text": "second 文档", "id": 2}, {"text": "third"})
    (tmp_path / "a.jsonl").write_bytes(data)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    got, skipped = records("jsonl", tmp_path)
    texts = [raw for _, raw, _ in got]
    assert texts == [b"first doc", "second 文档".encode(), b"third"] * 3
    assert [ref for ref, _, _ in got][:4] == ["a.jsonl:1", "a.jsonl:2", "a.jsonl:3", "b.jsonl.gz:1"]
    assert all(reason is None for _, _, reason in got) and not skipped


def test_bad_jsonl_lines_are_quarantined_verbatim_and_the_rest_is_read(tmp_path):
    lines = [b'{"text": "ok one"}', b'{"text": "unterminated', b"[1, 2]", b'{"body": "no text"}',
             b'{"text": null}', b"", b"   ", b'{"text": "ok two"}\r']
    (tmp_path / "x.jsonl").write_bytes(b"\n".join(lines))
    got, skipped = records("jsonl", tmp_path / "x.jsonl")
    assert [(ref, reason) for ref, _, reason in got] == [
        ("x.jsonl:1", None), ("x.jsonl:2", "malformed_json"), ("x.jsonl:3", "not_an_object"),
        ("x.jsonl:4", "missing_text_field"), ("x.jsonl:5", "missing_text_field"), ("x.jsonl:8", None)]
    assert got[1][1] == b'{"text": "unterminated'  # verbatim
    assert got[-1][1] == b"ok two" and skipped == {"blank_line": 2}
    detail = next(read_path("jsonl", tmp_path / "x.jsonl")).detail
    assert detail == ""
    bad = next(r for r in read_path("jsonl", tmp_path / "x.jsonl") if r.reason == "malformed_json")
    assert bad.detail.startswith("x.jsonl line 2: ")


def test_a_line_nested_past_the_parser_limit_is_quarantined_and_the_others_read(tmp_path):
    """Issue 22, item 4: one such line raised RecursionError and lost the whole file."""
    deep = b'{"text": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    (tmp_path / "x.jsonl").write_bytes(jsonl({"text": "before"}, deep, {"text": "after"}))
    got, _ = records("jsonl", tmp_path / "x.jsonl")
    assert [(ref, reason) for ref, _, reason in got] == [
        ("x.jsonl:1", None), ("x.jsonl:2", "malformed_json"), ("x.jsonl:3", None)]
    assert got[1][1] == deep  # verbatim, for the quarantine
    bad = next(r for r in read_path("jsonl", tmp_path / "x.jsonl") if r.reason)
    assert "nested deeper than the JSON parser's limit" in bad.detail


def test_invalid_utf8_and_lone_surrogates_pass_through_as_bytes(tmp_path):
    (tmp_path / "u.jsonl").write_bytes(b'{"text": "caf\xe9 bytes"}\n{"text": "lone \\ud800 here"}\n')
    got, _ = records("jsonl", tmp_path)
    assert got[0][1] == b"caf\xe9 bytes"  # the original byte, for the clean step's policy
    assert got[1][1] == b"lone \xed\xa0\x80 here"  # encoded surrogate (surrogatepass)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_truncated_compressed_jsonl_keeps_lines_before_and_quarantines_the_tail(tmp_path, suffix):
    # > 128 KiB so zstd writes several blocks (a partial block decodes to nothing)
    data = jsonl(*({"text": f"document number {i} " + f"word{i * 7919 % 1000} " * 50} for i in range(2000)))
    packed = gzip.compress(data) if suffix == ".gz" else zstandard.ZstdCompressor().compress(data)
    (tmp_path / f"t.jsonl{suffix}").write_bytes(packed[: len(packed) * 2 // 3])
    got, _ = records("jsonl", tmp_path)
    good = [g for g in got if g[2] is None]
    assert got[-1][2] == "truncated_file" and all(g[2] is None for g in got[:-1])
    assert 0 < len(good) < 2000
    assert [g[1] for g in good] == [json.loads(line)["text"].encode() for line in data.split(b"\n")[: len(good)]]


def test_zero_length_files_and_blank_shards_are_counted(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    got, skipped = records("jsonl", tmp_path)
    assert got == [] and skipped == {"empty_file": 2}


def test_parquet_rows_nulls_empty_and_corrupt_files(tmp_path):
    pq.write_table(pa.table({"text": ["row zero", None, "row two"], "n": [0, 1, 2]}), tmp_path / "a.parquet",
                   row_group_size=2)
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "b.parquet")
    (tmp_path / "c.parquet").write_bytes(b"")
    (tmp_path / "d.parquet").write_bytes(b"PAR1 this is not parquet")
    got, skipped = records("parquet", tmp_path)
    assert [(ref, reason) for ref, _, reason in got] == [
        ("a.parquet:0", None), ("a.parquet:1", "missing_text_field"), ("a.parquet:2", None),
        ("d.parquet:0", "unreadable_file")]
    assert json.loads(got[1][1]) == {"n": 1, "text": None}
    assert got[3][1] == b"PAR1 this is not parquet"
    assert skipped == {"empty_file": 2}


def test_text_folder_one_document_per_file_in_natural_order(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "doc10.txt").write_bytes(b"ten")
    (tmp_path / "doc2.txt").write_bytes(b"\xef\xbb\xbftwo\r\nlines")
    (tmp_path / "sub" / "z.txt.gz").write_bytes(gzip.compress(b"zipped"))
    (tmp_path / ".hidden").write_bytes(b"skip me")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(b"x" * 5000)[:20])
    got, skipped = records("text", tmp_path)
    assert [(ref, raw, reason) for ref, raw, reason in got if reason is None] == [
        ("doc2.txt", b"\xef\xbb\xbftwo\r\nlines", None), ("doc10.txt", b"ten", None), ("sub/z.txt.gz", b"zipped", None)]
    assert [ref for ref, _, reason in got if reason == "truncated_file"] == ["cut.txt.gz"]
    assert skipped == {"empty_file": 1}


def test_paths_are_checked(tmp_path):
    with pytest.raises(ValueError, match="gs:// source paths are not supported"):
        list_files("gs://bucket/corpus/")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_files(tmp_path / "missing")
    (tmp_path / "empty" / ".hidden").mkdir(parents=True)
    (tmp_path / "empty" / ".hidden" / "a.jsonl").write_bytes(b'{"text": "hidden"}\n')
    with pytest.raises(FileNotFoundError, match="has no file"):
        list_files(tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown path format"):
        list(read_path("csv", tmp_path))


def test_s3_prefix_reads_like_the_local_folder(tmp_path, monkeypatch):
    """A real S3 API (moto server on loopback) through the storage layer's boto3 client."""
    import boto3

    from tests.storage.servers import MotoServer

    server = MotoServer().start()
    try:
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "TIDAL_S3_ENDPOINT_URL": server.endpoint,
                           "AWS_CONFIG_FILE": str(tmp_path / "none"),
                           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
            monkeypatch.setenv(key, value)
        local = tmp_path / "corpus"
        (local / "part").mkdir(parents=True)
        (local / "a.jsonl").write_bytes(jsonl({"text": "one"}, b"{broken", {"text": "two"}))
        (local / "part" / "b10.jsonl.gz").write_bytes(gzip.compress(jsonl({"text": "three"})))
        (local / "part" / "b2.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl({"text": "four"})))
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="corpora")
        for path in local.rglob("*"):
            if path.is_file():
                client.put_object(Bucket="corpora", Key=f"web/{path.relative_to(local).as_posix()}",
                                  Body=path.read_bytes())
        client.put_object(Bucket="corpora", Key="web2/other.jsonl", Body=jsonl({"text": "not under web/"}))
        want, _ = records("jsonl", local)
        got, _ = records("jsonl", "s3://corpora/web")
        assert got == want and [r for r, _, _ in got] == ["a.jsonl:1", "a.jsonl:2", "a.jsonl:3",
                                                          "part/b2.jsonl.zst:1", "part/b10.jsonl.gz:1"]
        assert records("jsonl", "s3://corpora/web/a.jsonl")[0] == want[:3]
        # the snapshot hash of the downloaded objects is the local copy's
        local_digests, s3_digests = [], []
        list(read_path("jsonl", local, digests=local_digests))
        list(read_path("jsonl", "s3://corpora/web", digests=s3_digests))
        assert s3_digests == local_digests and len(s3_digests) == 3
        assert snapshot_sha256(s3_digests) == snapshot_sha256(local_digests)
        with pytest.raises(FileNotFoundError, match="no object"):
            records("jsonl", "s3://corpora/missing/")
    finally:
        server.stop()
