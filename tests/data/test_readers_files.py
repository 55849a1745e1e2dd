"""Local file sources on disk: symlinked folders followed, cycles and broken links named, and a
file that changes while fetch reads it (hashed, then parsed) detected."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess

import pytest

from tests.data.test_fetch_snapshot import corpus, run_fetch
from tests.data.test_readers import jsonl, records
from tidal.data.readers import list_files, read_path
from tidal.data.snapshot import snapshot_sha256

# corpus()'s files plus those reached through links, in natural order of their names under the root
LINKED_ORDER = ["a.jsonl", "linked/c9.jsonl", "linked/c10.jsonl", "linked/deep/d.jsonl.gz", "one.jsonl",
                "part/b2.jsonl", "part/b10.jsonl.gz"]


def linked_corpus(tmp_path):
    """corpus() under ``web/`` with a symlinked folder and a symlinked file that live outside it."""
    root = corpus(tmp_path / "web")
    outside = tmp_path / "elsewhere"
    (outside / "deep").mkdir(parents=True)
    (outside / "c10.jsonl").write_bytes(jsonl({"text": "ten"}, {"text": "ten, 2"}))
    (outside / "c9.jsonl").write_bytes(jsonl({"text": "nine"}))
    (outside / "deep" / "d.jsonl.gz").write_bytes(gzip.compress(jsonl({"text": "deep"})))
    (outside / ".hidden.jsonl").write_bytes(jsonl({"text": "hidden behind the link"}))
    (tmp_path / "single.jsonl").write_bytes(jsonl({"text": "single"}))
    os.symlink("../elsewhere", root / "linked")  # relative link, as a user would make it
    os.symlink(tmp_path / "single.jsonl", root / "one.jsonl")
    os.symlink("nowhere", root / ".stale")  # hidden: skipped, even broken
    return root


def sha256sum_snapshot(root, names) -> str:
    """sha256sum (which follows links) of ``names`` from ``root``, piped into sha256sum: apart from tidal."""
    lines = subprocess.run(["sha256sum", *names], cwd=root, capture_output=True, check=True).stdout
    return hashlib.sha256(lines).hexdigest()


def test_symlinked_folders_and_files_are_read_under_their_names_in_the_source(tmp_path):
    root = linked_corpus(tmp_path)
    assert [(rel, str(full)) for rel, full in list_files(root)] == [(rel, str(root / rel)) for rel in LINKED_ORDER]
    digests: list = []
    got, skipped = records("jsonl", root, digests=digests)
    assert [ref for ref, _, _ in got] == [
        "a.jsonl:1", "a.jsonl:2", "a.jsonl:3", "linked/c9.jsonl:1", "linked/c10.jsonl:1", "linked/c10.jsonl:2",
        "linked/deep/d.jsonl.gz:1", "one.jsonl:1", "part/b2.jsonl:1", "part/b10.jsonl.gz:1"]
    assert [raw for _, raw, reason in got if reason is None] == [
        b"one", b"two", b"nine", b"ten", b"ten, 2", b"deep", b"single", b"four", b"three"]
    assert not skipped
    assert [(rel, size) for rel, _, size in digests] == [(rel, (root / rel).stat().st_size) for rel in LINKED_ORDER]
    assert snapshot_sha256(digests) == sha256sum_snapshot(root, LINKED_ORDER)
    # the fetch step sees the same: its pinned snapshot is sha256sum's
    summary, _ = run_fetch(tmp_path, root, "fetched", snapshot_sha256=sha256sum_snapshot(root, LINKED_ORDER))
    assert summary["documents"] == 10 and summary["unparsed"] == 1


def test_the_source_root_may_itself_be_a_link(tmp_path):
    root = linked_corpus(tmp_path)
    os.symlink(root, tmp_path / "alias")
    assert [rel for rel, _ in list_files(tmp_path / "alias")] == LINKED_ORDER


def test_a_symlink_cycle_is_a_clear_error_naming_the_link_and_the_folder(tmp_path):
    root = corpus(tmp_path / "web")
    os.symlink("..", root / "part" / "up")  # part/up -> web: loops back to the root
    with pytest.raises(ValueError, match="loops back to") as err:
        list_files(root)
    assert f"symlink {root / 'part' / 'up'} -> .. loops back to {root}, a folder already being walked" in str(err.value)
    with pytest.raises(ValueError, match="loops back to"):
        list(read_path("jsonl", root))
    # through two links: x/to_y -> y, y/to_x -> x; whichever is met second names the loop
    other = tmp_path / "other"
    (other / "x").mkdir(parents=True)
    (other / "y").mkdir()
    (other / "x" / "a.jsonl").write_bytes(jsonl({"text": "a"}))
    os.symlink("../y", other / "x" / "to_y")
    os.symlink("../x", other / "y" / "to_x")
    with pytest.raises(ValueError, match="loops back to") as err:
        list_files(other)
    assert str(other / "x" / "to_y" / "to_x") in str(err.value) or str(other / "y" / "to_x" / "to_y") in str(err.value)


def test_a_cycle_closed_below_a_link_names_the_link(tmp_path):
    root = corpus(tmp_path / "corpora" / "web")
    os.symlink("../..", root / "part" / "top")  # part/top -> corpora, which holds web again: part/top/web
    with pytest.raises(ValueError, match="loops back to") as err:
        list_files(root)
    assert (f"symlink {root / 'part' / 'top'} -> ../.. loops back to {root}, a folder already being walked "
            f"(as {root / 'part' / 'top' / 'web'})") in str(err.value)


def test_a_link_to_a_sibling_folder_is_not_a_cycle(tmp_path):
    root = corpus(tmp_path / "web")
    os.symlink("part", root / "again")  # the same files twice, under two names: not a loop
    assert [rel for rel, _ in list_files(root)] == [
        "a.jsonl", "again/b2.jsonl", "again/b10.jsonl.gz", "part/b2.jsonl", "part/b10.jsonl.gz"]


def test_a_self_looping_link_is_named(tmp_path):
    root = corpus(tmp_path / "web")
    os.symlink("loop", root / "loop")
    with pytest.raises(ValueError, match="loops on itself") as err:
        list_files(root)
    assert f"symlink {root / 'loop'} -> loop" in str(err.value)


def test_a_broken_symlink_is_named(tmp_path):
    root = corpus(tmp_path / "web")
    os.symlink("../gone.jsonl", root / "part" / "b3.jsonl")
    with pytest.raises(FileNotFoundError, match="broken symlink") as err:
        list(read_path("jsonl", root))
    assert f"{root / 'part' / 'b3.jsonl'} -> ../gone.jsonl" in str(err.value)
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    with pytest.raises(FileNotFoundError, match=f"broken symlink {tmp_path / 'dangling'}"):
        list_files(tmp_path / "dangling")


def read_and_change(root, change):
    """Read ``root`` with digests, calling ``change()`` right after the first record of ``a.jsonl``."""
    digests: list = []
    refs = []
    reader = read_path("jsonl", root, digests=digests)
    for record in reader:
        refs.append(record.ref)
        if record.ref == "a.jsonl:1":
            change()
    return refs, digests


def test_a_file_appended_to_while_read_fails_naming_it(tmp_path):
    root = corpus(tmp_path / "web")
    target = root / "a.jsonl"
    size = target.stat().st_size

    def append():
        with open(target, "ab") as handle:
            handle.write(jsonl({"text": "late"}))

    with pytest.raises(ValueError, match="changed while fetch read it") as err:
        read_and_change(root, append)
    assert (str(target) in str(err.value) and f"size {size} -> {size + 17}" in str(err.value)
            and "rerun the step" in str(err.value))


def test_a_file_replaced_or_removed_while_read_fails(tmp_path):
    root = corpus(tmp_path / "web")
    target = root / "a.jsonl"
    same_size = target.read_bytes().replace(b"one", b"ONE")

    def replace():  # atomic rename of an edited copy of the same size: a new inode
        (root / "a.tmp").write_bytes(same_size)
        os.replace(root / "a.tmp", target)

    with pytest.raises(ValueError, match="changed while fetch read it") as err:
        read_and_change(root, replace)
    assert "inode" in str(err.value) and "size" not in str(err.value)
    with pytest.raises(ValueError, match=r"changed while fetch read it \(it is gone\)"):
        read_and_change(root, target.unlink)


def test_an_unchanged_folder_reads_through_and_a_file_changed_before_its_turn_is_fine(tmp_path):
    root = corpus(tmp_path / "web")
    # part/b2.jsonl is edited while a.jsonl is read: before b2 is hashed, so hash and records agree
    refs, digests = read_and_change(root, lambda: (root / "part" / "b2.jsonl").write_bytes(jsonl({"text": "4"})))
    assert refs == ["a.jsonl:1", "a.jsonl:2", "a.jsonl:3", "part/b2.jsonl:1", "part/b10.jsonl.gz:1"]
    assert snapshot_sha256(digests) == sha256sum_snapshot(root, ["a.jsonl", "part/b2.jsonl", "part/b10.jsonl.gz"])


def test_a_reader_closed_early_checks_its_last_file(tmp_path):
    root = corpus(tmp_path / "web")
    reader = read_path("jsonl", root, "text", None, [])
    assert next(reader).ref == "a.jsonl:1"
    with open(root / "a.jsonl", "ab") as handle:
        handle.write(jsonl({"text": "late"}))
    with pytest.raises(ValueError, match="a.jsonl changed while fetch read it"):
        reader.close()


def test_fetch_with_max_documents_checks_the_file_it_stopped_in(tmp_path, monkeypatch):
    """fetch stops after the first record (max_documents=1), inside a.jsonl; a.jsonl grows
    while that record is handled: fetch fails naming it (and passes when nothing changed)."""
    from tidal.data import fetch

    root = corpus(tmp_path / "web")
    summary, _ = run_fetch(tmp_path, root, "unchanged", max_documents=1)
    assert summary["documents"] == 1
    original = fetch.ref_sort_key

    def key_and_append(ref):
        with open(root / "a.jsonl", "ab") as handle:
            handle.write(jsonl({"text": "late"}))
        return original(ref)

    monkeypatch.setattr(fetch, "ref_sort_key", key_and_append)
    with pytest.raises(ValueError, match="a.jsonl changed while fetch read it"):
        run_fetch(tmp_path, root, "changed", max_documents=1)
