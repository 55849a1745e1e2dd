"""tidal/storage/layout.py: the step contract's names and the atomic write every writer uses."""

from __future__ import annotations

import pytest

from tidal.storage import layout


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "step.json"
    target.write_text("old\n")
    layout.atomic_write_text(target, "new\n", durable=True)
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old\n")

    with pytest.raises(TypeError):
        layout.atomic_write_bytes(target, object())  # not bytes: the write fails mid-way
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_concurrent_writers_never_share_a_temporary_name(tmp_path):
    names = {layout.temporary_name(tmp_path / "x.parquet") for _ in range(1000)}
    assert len(names) == 1000 and all(n.parent == tmp_path and n.name.startswith(".x.parquet.") for n in names)


def test_commit_files_are_the_contract_names():
    assert layout.COMMIT_FILES == ("manifest.json", "step.json", "signature.json", "_SUCCESS")
