"""The candidates of `tidal size --search` (issue 40, item 4) and what `--write` does to a recipe file; the
compiled search itself is in tests/train/test_sizing.py."""

from __future__ import annotations

import pytest

from tidal.train.flops import ModelShape
from tidal.train.mesh_search import Candidate, meshes, microbatch_counts, write_choice


def _model(**kw) -> ModelShape:
    return ModelShape(**{"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512, "vocab_size": 4096, **kw})


def _triples(found):
    return [(m["data"], m["fsdp"], m["tensor"]) for m in found]


def test_every_factorization_of_the_slice_the_trainer_can_run():
    assert _triples(meshes(4, 1, _model(), 16)) == [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    # tensor must divide every head count and d_ff: 3 heads allow no tensor parallelism over 2 or 4 chips
    assert _triples(meshes(4, 1, _model(n_heads=3, d_model=96), 16)) == [(1, 4, 1), (2, 2, 1), (4, 1, 1)]
    assert all(t in (1, 2) for _, _, t in _triples(meshes(8, 1, _model(n_heads=4, n_kv_heads=2), 64)))
    # the batch is sharded over data x fsdp: 6 sequences cannot go over 4 of them
    assert _triples(meshes(4, 1, _model(), 6)) == [(1, 1, 4), (1, 2, 2), (2, 1, 2)]
    # two slices: only data parallelism crosses the DCN between them
    assert all(d % 2 == 0 for d, _, _ in _triples(meshes(8, 2, _model(), 64)))
    # an axis the recipe's train.mesh sets stays as it is
    assert _triples(meshes(4, 1, _model(), 16, {"tensor": 1, "data": None})) == [(1, 4, 1), (2, 2, 1), (4, 1, 1)]
    assert meshes(4, 1, _model(), 16, {"tensor": 3}) == []


def test_microbatch_counts_keep_every_microbatch_whole_on_every_chip():
    assert microbatch_counts(16, {"data": 1, "fsdp": 4, "tensor": 1}) == [1, 2, 4]
    assert microbatch_counts(24, {"data": 2, "fsdp": 2, "tensor": 1}) == [1, 2, 3, 6]
    assert microbatch_counts(4, {"data": 4, "fsdp": 1, "tensor": 1}) == [1]


def test_write_sets_the_mesh_and_microbatches_and_keeps_the_files_comments(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: r  # the run\ntrain:\n  # sized on v5e\n  steps: 10\n  batch_size: 16\n")
    write_choice(path, Candidate({"data": 1, "fsdp": 4, "tensor": 1}, 1, None))
    text = path.read_text()
    assert text == ("name: r  # the run\ntrain:\n  # sized on v5e\n  steps: 10\n  batch_size: 16\n"
                    "  mesh: {data: 1, fsdp: 4, tensor: 1}\n")  # one microbatch: the default, not written
    write_choice(path, Candidate({"data": 2, "fsdp": 2, "tensor": 1}, 4, None))
    assert path.read_text().endswith("  mesh: {data: 2, fsdp: 2, tensor: 1}\n  microbatches: 4\n")
    write_choice(path, Candidate({"data": 2, "fsdp": 2, "tensor": 1}, 1, None))
    assert path.read_text().endswith("  microbatches: 1\n")  # a count the file names is kept true


def test_write_refuses_a_file_that_is_not_a_recipe_mapping(tmp_path):
    from tidal.config import RecipeError

    path = tmp_path / "r.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(RecipeError, match="a recipe is a mapping of fields"):
        write_choice(path, Candidate({"data": 1, "fsdp": 1, "tensor": 1}, 1, None))
