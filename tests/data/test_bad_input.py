"""Bad input through the real fetch (JSONL reader) and clean (Beam) steps: each defect is counted
under a clear reason, nothing crashes, and every record is accounted for."""

from __future__ import annotations

import codecs
import gzip
import json
import unicodedata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tidal.context import StepContext
from tidal.data import clean, fetch

SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank"
CAFE = "The café on the corner serves strong coffee to every early visitor"
POEM = "春风又绿江南岸，明月何时照我还。千山鸟飞绝，万径人踪灭。"
BIG_WORDS = 10_000_000  # "word " x 10M = 50 MB on one line


def line(text: str) -> bytes:
    return json.dumps({"text": text}).encode()


def corpus(tmp_path):
    """A folder of JSONL files holding one of each defect; returns (path, expected refs)."""
    src = tmp_path / "corpus"
    src.mkdir()
    lines = [
        line(SENTENCE + " one"),                                           # 1 kept
        b'{"text": "caf\xe9 bytes that are not UTF-8 at all in this line"}',  # 2 invalid UTF-8
        line("a lone surrogate \ud800 inside an otherwise fine document"),  # 3 lone surrogate
        line("NUL \x00 and bell \x07 control characters are stripped from text"),  # 4 kept
        line("\x1b[1;31mColoured terminal text survives as plain words\x1b[0m"),   # 5 kept
        line(""),                                                           # 6 empty
        line("   \n\t  "),                                                  # 7 empty (whitespace)
        b'{"text": "malformed json line',                                   # 8 malformed
        line("\ufeffBOM first line\r\nsecond line\rthird line\u2028fourth line"),  # 9 kept
        line("A document about <|endoftext|> tokens written as plain text"),  # 10 kept, counted
        line(POEM),                                                          # 11 kept (CJK)
        line(unicodedata.normalize("NFC", CAFE)),                            # 12 kept
        line(unicodedata.normalize("NFD", CAFE)),                            # 13 exact duplicate of 12
        line(SENTENCE + " one"),                                             # 14 exact duplicate of 1
    ]
    (src / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (src / "b.jsonl").write_bytes(b'{"text": "' + b"word " * BIG_WORDS + b'"}\n')  # 50 MB line: too_long
    (src / "c.jsonl").write_bytes(b"")                                      # zero-length shard
    (src / "d.jsonl.gz").write_bytes(gzip.compress(b""))                   # zero-row shard
    whole = gzip.compress(b"".join(line(f"{SENTENCE} number {i} in a compressed shard") + b"\n"
                                   for i in range(3000)))
    (src / "e.jsonl.gz").write_bytes(whole[: len(whole) // 2])             # truncated gzip
    return src


def run_steps(tmp_path, src, **clean_config):
    fetch_out = tmp_path / "fetch"
    fetch_out.mkdir(exist_ok=True)
    fetch_summary = fetch.run(StepContext("f", "fetch-bad", "fetch", {"source": "bad", "format": "jsonl",
                                                                     "path": str(src)}, fetch_out))
    out = tmp_path / f"clean-{len(list(tmp_path.glob('clean-*')))}"
    out.mkdir()
    config = {"source": "bad", "input": "fetch-bad", "shards": 2, **clean_config}
    summary = clean.run(StepContext("c", "clean-bad", "clean", config, out, inputs={"fetch-bad": fetch_out}))
    return fetch_summary, summary, out


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("bad")
    return run_steps(tmp_path, corpus(tmp_path))


def test_every_record_is_accounted_for(cleaned):
    fetch_summary, summary, out = cleaned
    counts = json.loads((out / "counts.json").read_text())
    truncated_kept = counts["in"] - 15  # lines of e.jsonl.gz read before the cut, + 1 truncated tail
    assert fetch_summary["skipped_empty_file"] == 2
    assert fetch_summary["unparsed"] == 2  # malformed line + truncated tail
    assert summary["in"] == summary["kept"] + summary["filtered"] + summary["duplicates"] + summary["quarantined"]
    assert {k: n for k, n in counts["quarantined"].items() if n} == {
        "invalid_utf8": 1, "lone_surrogate": 1, "malformed_json": 1, "truncated_file": 1}
    assert {k: n for k, n in counts["filtered"].items() if n} == {"empty": 2, "too_long": 1}
    assert counts["duplicates_by_kind"] == {"exact": 2, "near": 0}
    assert counts["kept"] == 7 + truncated_kept - 1 and 0 < truncated_kept - 1 < 3000
    assert counts["special_tokens"] == {"text": 1}


def test_quarantine_keeps_the_bytes_verbatim_with_file_line_and_reason(cleaned):
    _, _, out = cleaned
    rows = {r["ref"]: r for r in pq.read_table(out / "quarantine.parquet").to_pylist()}
    assert rows["a.jsonl:2"]["raw"] == "caf\xe9 bytes that are not UTF-8 at all in this line".encode("latin-1")
    assert rows["a.jsonl:2"]["reason"] == "invalid_utf8" and rows["a.jsonl:2"]["detail"].startswith("byte 3:")
    assert rows["a.jsonl:3"]["reason"] == "lone_surrogate"
    assert rows["a.jsonl:8"] == {"ref": "a.jsonl:8", "raw": b'{"text": "malformed json line',
                                 "reason": "malformed_json", "detail": rows["a.jsonl:8"]["detail"], "fields": None}
    assert "a.jsonl line 8" in rows["a.jsonl:8"]["detail"]
    truncated = [r for r in rows.values() if r["reason"] == "truncated_file"]
    assert len(truncated) == 1 and truncated[0]["ref"].startswith("e.jsonl.gz:")


def test_kept_text_is_normalized_and_duplicates_point_at_their_survivor(cleaned):
    _, _, out = cleaned
    docs = {r["ref"]: r for k in range(2) for r in pq.read_table(out / clean.shard_name(k, 2)).to_pylist()}
    assert docs["a.jsonl:4"]["text"] == "NUL  and bell  control characters are stripped from text"
    assert docs["a.jsonl:5"]["text"] == "Coloured terminal text survives as plain words"
    assert docs["a.jsonl:9"]["text"] == "BOM first line\nsecond line\nthird line\nfourth line"
    assert "<|endoftext|>" in docs["a.jsonl:10"]["text"]  # policy "text": kept, encoded as plain text later
    assert docs["a.jsonl:11"]["text"] == POEM and docs["a.jsonl:11"]["language"] == "zh"
    assert docs["a.jsonl:12"]["text"] == unicodedata.normalize("NFC", CAFE)
    assert "a.jsonl:13" not in docs and "a.jsonl:14" not in docs
    removed = {r["ref"]: r for r in pq.read_table(out / "removed.parquet").to_pylist()}
    assert removed["a.jsonl:13"]["cluster"] == docs["a.jsonl:12"]["id"]
    assert removed["a.jsonl:14"] == {"ref": "a.jsonl:14", "outcome": "duplicate", "reason": "exact",
                                     "cluster": docs["a.jsonl:1"]["id"], "detail": None, "fields": None}
    assert removed["b.jsonl:1"]["reason"] == "too_long" and removed["a.jsonl:6"]["reason"] == "empty"


def test_kept_records_that_were_repaired_are_counted_by_normalization_step(cleaned):
    _, summary, out = cleaned
    counts = json.loads((out / "counts.json").read_text())
    # line 4 controls, line 5 ANSI, line 9 BOM + CRLF/CR/U+2028, line 13 NFD -> NFC
    assert counts["normalized"] == {"bom": 1, "ansi": 1, "newlines": 1, "unicode_form": 1, "controls": 1}
    assert summary["normalized_controls"] == 1 and summary["normalized_unicode_form"] == 1


def test_repair_and_special_token_policies(tmp_path):
    src = tmp_path / "small"
    src.mkdir()
    (src / "a.jsonl").write_bytes(b"\n".join([
        b'{"text": "caf\xe9 bytes that are not UTF-8 at all in this line"}',
        line("a lone surrogate \ud800 inside an otherwise fine document"),
        line("A document about <|endoftext|> tokens written as plain text"),
    ]))
    _, summary, out = run_steps(tmp_path, src, invalid_utf8="repair", special_tokens="strip")
    texts = sorted(r["text"] for k in range(2) for r in pq.read_table(out / clean.shard_name(k, 2)).to_pylist())
    assert texts == ["A document about  tokens written as plain text",
                     "a lone surrogate \ufffd\ufffd\ufffd inside an otherwise fine document",
                     "caf\ufffd bytes that are not UTF-8 at all in this line"]
    assert (summary["repaired_invalid_utf8"], summary["repaired_lone_surrogate"], summary["quarantined"]) == (1, 1, 0)
    assert summary["special_tokens_strip"] == 1
    _, summary, out = run_steps(tmp_path, src, special_tokens="quarantine")
    assert summary["quarantined_special_token"] == 1 and summary["quarantined_invalid_utf8"] == 1
    assert summary["in"] == 3 == summary["kept"] + summary["quarantined"]


# ---------------------------------------------------------------- more containers and formats


def fetch_and_clean(tmp_path, src, fmt, **clean_config):
    """The real fetch (``fmt`` reader) and clean steps on ``src``; returns (fetch summary,
    clean summary, counts.json, {ref: kept document row}, {ref: quarantine row})."""
    fetch_out = tmp_path / f"fetch-{fmt}"
    fetch_out.mkdir()
    fetch_summary = fetch.run(StepContext("f", "fetch-bad", "fetch", {"source": "bad", "format": fmt,
                                                                     "path": str(src)}, fetch_out))
    out = tmp_path / f"clean-{fmt}"
    out.mkdir()
    config = {"source": "bad", "input": "fetch-bad", "shards": 2, **clean_config}
    summary = clean.run(StepContext("c", "clean-bad", "clean", config, out, inputs={"fetch-bad": fetch_out}))
    counts = json.loads((out / "counts.json").read_text())
    assert counts["in"] == fetch_summary["documents"]  # every record the reader met reached the clean step
    assert summary["in"] == summary["kept"] + summary["filtered"] + summary["duplicates"] + summary["quarantined"]
    docs = {r["ref"]: r for k in range(2) for r in pq.read_table(out / clean.shard_name(k, 2)).to_pylist()}
    quarantined = {r["ref"]: r for r in pq.read_table(out / "quarantine.parquet").to_pylist()}
    return fetch_summary, summary, counts, docs, quarantined


def nonzero(group: dict) -> dict:
    return {k: n for k, n in group.items() if n}


def test_jsonl_zst_truncation_zero_byte_shards_bom_and_non_text_records(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.jsonl").write_bytes(
        codecs.BOM_UTF8 + line(SENTENCE + " after a byte-order mark") + b"\r\n"        # 1 kept, BOM dropped
        + line("Windows end\r\nold Mac end\rUnix end\nall in one document here") + b"\r\n"  # 2 kept
        + b"[1, 2, 3]\r\n"                                                              # 3 not_an_object
        + b'{"body": "the text is under another key"}\n'                                 # 4 missing_text_field
        + b'{"text": null}\n'                                                            # 5 missing_text_field
        + b"\xef\xbb\xbf" + line(SENTENCE + " with a BOM inside the file") + b"\n")     # 6 malformed_json
    (src / "b.jsonl.gz").write_bytes(b"")                                               # zero-byte shards
    (src / "c.jsonl.zst").write_bytes(b"")
    (src / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b""))        # zero-row shard
    data = b"".join(line(f"{SENTENCE} record {i} " + f"term{i * 7919 % 1000} " * 40) + b"\n" for i in range(2000))
    packed = zstandard.ZstdCompressor().compress(data)  # > 128 KiB: several zstd blocks
    (src / "e.jsonl.zst").write_bytes(packed[: len(packed) * 2 // 3])                  # truncated zstd
    fetch_summary, _, counts, docs, quarantined = fetch_and_clean(tmp_path, src, "jsonl")
    assert fetch_summary["skipped_empty_file"] == 3
    assert nonzero(counts["quarantined"]) == {"not_an_object": 1, "missing_text_field": 2, "malformed_json": 1,
                                              "truncated_file": 1}
    assert nonzero(counts["filtered"]) == {} and counts["duplicates"] == 0
    assert nonzero(counts["normalized"]) == {"newlines": 1}  # the BOM before line 1 is the reader's
    kept_zst = [ref for ref in docs if ref.startswith("e.jsonl.zst:")]
    assert 0 < len(kept_zst) < 2000 and counts["kept"] == 2 + len(kept_zst)
    assert sorted(kept_zst, key=lambda r: int(r.split(":")[1])) == [
        f"e.jsonl.zst:{i}" for i in range(1, len(kept_zst) + 1)]
    assert quarantined[f"e.jsonl.zst:{len(kept_zst) + 1}"]["reason"] == "truncated_file"
    assert docs["a.jsonl:1"]["text"] == SENTENCE + " after a byte-order mark"
    assert docs["a.jsonl:2"]["text"] == "Windows end\nold Mac end\nUnix end\nall in one document here"
    assert quarantined["a.jsonl:3"]["raw"] == b"[1, 2, 3]\r" and quarantined["a.jsonl:3"]["reason"] == "not_an_object"
    assert "a.jsonl line 4" in quarantined["a.jsonl:4"]["detail"] and "'text'" in quarantined["a.jsonl:4"]["detail"]
    assert quarantined["a.jsonl:6"]["raw"].startswith(codecs.BOM_UTF8)  # verbatim, BOM and all


def test_parquet_shards_zero_rows_zero_bytes_truncated_and_null_text(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    pq.write_table(pa.table({"text": [CAFE, None, POEM, unicodedata.normalize("NFD", CAFE)]}), src / "a.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), src / "b.parquet")  # zero rows
    (src / "c.parquet").write_bytes(b"")                                               # zero bytes
    whole = src / "whole.parquet"
    pq.write_table(pa.table({"text": [f"{SENTENCE} row {i}" for i in range(100)]}), whole)
    (src / "d.parquet").write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])   # truncated file
    whole.unlink()
    fetch_summary, _, counts, docs, quarantined = fetch_and_clean(tmp_path, src, "parquet")
    assert fetch_summary["skipped_empty_file"] == 2
    assert nonzero(counts["quarantined"]) == {"missing_text_field": 1, "unreadable_file": 1}
    assert counts["duplicates_by_kind"] == {"exact": 1, "near": 0}  # the NFD row is the NFC row
    assert sorted(docs) == ["a.parquet:0", "a.parquet:2"] and docs["a.parquet:2"]["language"] == "zh"
    assert quarantined["a.parquet:1"]["reason"] == "missing_text_field"
    assert quarantined["d.parquet:0"]["raw"] == (src / "d.parquet").read_bytes()  # the whole file, verbatim
    assert "d.parquet" in quarantined["d.parquet:0"]["detail"]


_ZST = zstandard.ZstdCompressor().compress("".join(f"{SENTENCE} line {i}\n" for i in range(5000)).encode())
CUT_ZST = _ZST[: len(_ZST) // 2]
KANA = "がぎぐげご、ざじずぜぞ。パピプペポの音を練習します。"
HANGUL = "모든 인간은 태어날 때부터 자유로우며 그 존엄과 권리에 있어 동등하다."


def test_text_files_each_defect_through_fetch_and_clean(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    files = {
        "bom.txt": b"\xef\xbb\xbfFirst line\r\nsecond line\rthird line\xe2\x80\xa8fourth line",  # kept
        "controls.txt": b"NUL \x00, bell \x07, DEL \x7f and \x1b[1;31mcolour\x1b[0m are stripped here",  # kept
        "surrogate.txt": b"a lone surrogate \xed\xa0\x80 written into a plain text file",  # lone_surrogate
        "latin1.txt": "caf\u00e9 written in Latin-1, not in UTF-8 at all".encode("latin-1"),  # invalid_utf8
        "blank.txt": b" \r\n\t \r\n",                                                      # empty
        "zero.txt": b"",                                                                   # skipped
        "kana-nfc.txt": unicodedata.normalize("NFC", KANA).encode(),                       # kept (ja)
        "kana-nfd.txt": unicodedata.normalize("NFD", KANA).encode(),                       # duplicate of nfc
        "hangul-nfd.txt": unicodedata.normalize("NFD", HANGUL).encode(),                   # kept, composed
        "special.txt": b"A text that mentions <|endoftext|> in the middle of a sentence",  # kept, counted
        "cut.txt.zst": CUT_ZST,                                                            # truncated_file
    }
    for name, data in files.items():
        (src / name).write_bytes(data)
    assert unicodedata.normalize("NFD", KANA) != KANA and unicodedata.normalize("NFD", HANGUL) != HANGUL
    fetch_summary, _, counts, docs, quarantined = fetch_and_clean(tmp_path, src, "text")
    assert fetch_summary["skipped_empty_file"] == 1
    assert nonzero(counts["quarantined"]) == {"lone_surrogate": 1, "invalid_utf8": 1, "truncated_file": 1}
    assert nonzero(counts["filtered"]) == {"empty": 1}
    assert counts["duplicates_by_kind"] == {"exact": 1, "near": 0} and counts["special_tokens"] == {"text": 1}
    assert counts["normalized"] == {"bom": 1, "ansi": 1, "newlines": 2, "unicode_form": 2, "controls": 1}
    assert sorted(docs) == ["bom.txt", "controls.txt", "hangul-nfd.txt", "kana-nfc.txt", "special.txt"]
    assert docs["bom.txt"]["text"] == "First line\nsecond line\nthird line\nfourth line"
    assert docs["controls.txt"]["text"] == "NUL , bell , DEL  and colour are stripped here"
    assert docs["kana-nfc.txt"]["text"] == KANA and docs["kana-nfc.txt"]["language"] == "ja"
    assert docs["hangul-nfd.txt"]["text"] == HANGUL and docs["hangul-nfd.txt"]["language"] == "ko"
    removed = {r["ref"]: r for r in pq.read_table(tmp_path / "clean-text" / "removed.parquet").to_pylist()}
    assert removed["kana-nfd.txt"]["cluster"] == docs["kana-nfc.txt"]["id"]
    assert quarantined["surrogate.txt"]["raw"] == files["surrogate.txt"]
    assert quarantined["latin1.txt"]["detail"].startswith("byte 3:")
