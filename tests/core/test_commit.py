"""The one commit path (tidal/core/commit.py): every place a step runs checks the kind's outputs.

Regression (issue 15): a clean step committed by a Beam-provider job skipped the row-count
check of its output files, and its expected outputs omitted ``removed.parquet``; in-process the
same outputs were refused. Both paths now go through ``commit_step``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.operators.test_beam import fake_fetch, write_recipe
from tidal.core.beam_job import JobIncomplete, commit, prepare
from tidal.core.commit import OutputsIncomplete, check_outputs, make_context
from tidal.core.load import load_pipeline
from tidal.data import clean


@pytest.fixture
def provider_job(tmp_path, tiny_data):
    """A clean step prepared for a Beam-provider job, with the job's outputs written into its scratch
    directory (by the kind itself, as ``python -m tidal.data.clean`` does on a worker)."""
    tiny_data["sources"]["brown"].pop("filters", None)  # one-line docs: brown's C4/Gopher would filter all
    path = write_recipe(tmp_path, tiny_data, "prov", {"launcher": "provider", "runner": "FnApiRunner"})
    pipe = load_pipeline(path, storage_root=str(tmp_path / "store"))
    fake_fetch(pipe, "fetch-brown")
    prepared = prepare(pipe, "clean-brown")
    work = Path(prepared["out"])
    step = pipe.graph["clean-brown"]
    clean.run(make_context(step, pipe.storage, work))
    return pipe, prepared, work, step


def test_a_provider_job_missing_removed_parquet_is_not_committed(provider_job):
    pipe, prepared, work, step = provider_job
    (work / clean.REMOVED_FILE).unlink()
    with pytest.raises(JobIncomplete, match=r"removed\.parquet"):
        commit(pipe, "clean-brown", prepared=prepared, runner="FnApiRunner")
    assert not pipe.storage.is_committed(step.step_id)


def test_a_provider_job_whose_shards_disagree_with_counts_is_not_committed(provider_job):
    pipe, prepared, work, step = provider_job
    shard = work / clean.shard_name(0, int(step.config.get("shards", 1)))
    table = pq.read_table(shard)
    pq.write_table(table.slice(1), shard)  # one kept document lost between the job and the commit
    with pytest.raises(ValueError, match=r"documents shards hold \d+ records but counts.json says"):
        commit(pipe, "clean-brown", prepared=prepared, runner="FnApiRunner")
    assert not pipe.storage.is_committed(step.step_id)


def test_the_same_outputs_commit_when_intact(provider_job):
    pipe, prepared, _, step = provider_job
    result = commit(pipe, "clean-brown", prepared=prepared, runner="FnApiRunner")
    assert result.status == "run" and pipe.storage.is_committed(step.step_id)


def test_in_process_and_provider_paths_check_the_same_contract(provider_job, tmp_path):
    """check_outputs is what both paths call: the same refusal for the same outputs."""
    _, _, work, step = provider_job
    copy = tmp_path / "copy"
    shutil.copytree(work, copy)
    (copy / clean.QUARANTINE_FILE).unlink()
    with pytest.raises(OutputsIncomplete, match=r"quarantine\.parquet"):
        check_outputs(step, copy)
    assert clean.expected_outputs(step.typed_config)[:3] == ["counts.json", "quarantine.parquet", "removed.parquet"]


def test_tokenize_outputs_are_checked_against_meta(tmp_path):
    import json

    import numpy as np

    from tidal.data import tokenize
    from tidal.data.tokenize_config import TokenizeConfig

    config = TokenizeConfig(source="s", input="clean-s", seq_len=8, shards=2)
    names = tokenize.expected_outputs(config)
    meta = {"seq_len": 8, "dtype": "uint16", "n_sequences": 5, "documents_failed": 1}
    (tmp_path / names[0]).write_text(json.dumps(meta))
    (tmp_path / names[1]).write_text(json.dumps([{"id": "a", "error": "lone surrogate"}]))
    np.save(tmp_path / names[2], np.zeros((3, 8), np.uint16))
    np.save(tmp_path / names[3], np.zeros((2, 8), np.uint16))
    tokenize.check_outputs(config, tmp_path)  # consistent
    np.save(tmp_path / names[3], np.zeros((1, 8), np.uint16))
    with pytest.raises(ValueError, match="hold 4 sequences but meta.json says 5"):
        tokenize.check_outputs(config, tmp_path)
    np.save(tmp_path / names[3], np.zeros((2, 9), np.uint16))
    with pytest.raises(ValueError, match=r"shape \(2, 9\)"):
        tokenize.check_outputs(config, tmp_path)


def test_refused_provider_outputs_are_kept_as_a_failed_attempt(provider_job):
    pipe, prepared, work, step = provider_job
    shard = work / clean.shard_name(0, int(step.config.get("shards", 1)))
    pq.write_table(pq.read_table(shard).slice(1), shard)
    with pytest.raises(ValueError):
        commit(pipe, "clean-brown", prepared=prepared, runner="FnApiRunner")
    kept = pipe.storage.failed_attempts(step.step_id)
    assert len(kept) == 1 and pipe.storage.read_object(kept[0] + clean.COUNTS_FILE) is not None and not work.exists()
