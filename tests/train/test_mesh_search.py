"""The candidates of `tidal size --search` (issue 40, item 4) and what `--write` does to a recipe file; the
compiled search itself is in tests/train/test_sizing.py."""

from __future__ import annotations

import pytest

from tidal.recipe.edit import write_train_mesh
from tidal.train.flops import ModelShape
from tidal.train.mesh_search import meshes, microbatch_counts


def _model(**kw) -> ModelShape:
    return ModelShape(**{"d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512, "vocab_size": 4096, **kw})


def _triples(found):
    return [(m["data"], m["fsdp"], m["tensor"]) for m in found]


def test_every_factorization_of_the_slice_the_trainer_can_run():
    assert _triples(meshes(4, 1, _model(), 16)) == [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    # tensor must divide every head count and d_ff: 3 heads allow no tensor parallelism over 2 or 4 chips
    assert _triples(meshes(4, 1, _model(n_heads=3, d_model=96), 16)) == [(1, 4, 1), (2, 2, 1), (4, 1, 1)]
    assert sorted({t for _, _, t in _triples(meshes(8, 1, _model(n_heads=4, n_kv_heads=2), 64))}) == [1, 2]
    # the batch is sharded over data x fsdp: 6 sequences cannot go over 4 of them
    assert _triples(meshes(4, 1, _model(), 6)) == [(1, 1, 4), (1, 2, 2), (2, 1, 2)]
    # two slices: only data parallelism crosses the DCN between them
    assert sorted({d for d, _, _ in _triples(meshes(8, 2, _model(), 64))}) == [2, 4, 8]
    # an axis the recipe's train.mesh sets stays as it is
    assert _triples(meshes(4, 1, _model(), 16, {"tensor": 1, "data": None})) == [(1, 4, 1), (2, 2, 1), (4, 1, 1)]
    assert meshes(4, 1, _model(), 16, {"tensor": 3}) == []


def test_microbatch_counts_keep_every_microbatch_whole_on_every_chip():
    assert microbatch_counts(16, {"data": 1, "fsdp": 4, "tensor": 1}) == [1, 2, 4]
    assert microbatch_counts(24, {"data": 2, "fsdp": 2, "tensor": 1}) == [1, 2, 3, 6]
    assert microbatch_counts(4, {"data": 4, "fsdp": 1, "tensor": 1}) == [1]


def test_write_edits_only_the_train_lines_and_leaves_every_other_byte(tmp_path):
    from tests.conftest import REPO

    path = tmp_path / "tiny.yaml"
    text = (REPO / "recipes" / "tiny.yaml").read_text()
    path.write_text(text)
    default = {"data": 1, "fsdp": 4, "tensor": 1}
    # the trainer's own mesh with one microbatch: nothing to write (a written mesh would change the step id)
    assert not write_train_mesh(path, default, 1, default) and path.read_text() == text
    assert write_train_mesh(path, {"data": 2, "fsdp": 2, "tensor": 1}, 4, default)
    assert path.read_text() == text + "  mesh: {data: 2, fsdp: 2, tensor: 1}\n  microbatches: 4\n"
    # a second write replaces those lines, and a count the file names is kept true
    assert write_train_mesh(path, {"data": 1, "fsdp": 4, "tensor": 1}, 1, default)
    assert path.read_text() == text + "  mesh: {data: 1, fsdp: 4, tensor: 1}\n  microbatches: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.yaml"]  # written by rename: no temporary left


def test_write_replaces_a_block_mesh_inside_the_train_section_and_keeps_what_follows(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: r  # the run\ntrain:\n  # sized on v5e\n  steps: 10\n  mesh:\n    tensor: 1  # fixed\n"
                    "  batch_size: 16\nschedule: null\n")
    assert write_train_mesh(path, {"data": 2, "fsdp": 2, "tensor": 1}, 1, {"data": 1, "fsdp": 4,
                                                                                          "tensor": 1})
    assert path.read_text() == ("name: r  # the run\ntrain:\n  # sized on v5e\n  steps: 10\n"
                                "  mesh: {data: 2, fsdp: 2, tensor: 1}\n  batch_size: 16\nschedule: null\n")


def test_write_refuses_what_it_cannot_edit_safely(tmp_path):
    from tidal.config import RecipeError

    chosen = {"data": 1, "fsdp": 1, "tensor": 1}
    path = tmp_path / "r.yaml"
    for text, rule in (("- a\n- b\n", "a recipe is a mapping of fields"),
                       ("name: r\ntrain: {steps: 10}\n", "flow style"),
                       ("name: r\ntrain:\n  steps: [1, 2\n", "cannot edit the file as it is"),  # not YAML
                       ('name: r\ntrain:\n  "mesh": {tensor: 1}\n', "could not edit its train block safely")):
        path.write_text(text)
        with pytest.raises(RecipeError, match=rule):
            write_train_mesh(path, chosen, 2)
        assert path.read_text() == text


def test_the_sizing_key_is_the_resolved_mesh_however_the_recipe_writes_it():
    """A default mesh and the same mesh written out are one program: one sizing, one compile."""
    from tests.conftest import TINY
    from tidal.recipe import load_recipe
    from tidal.train.config import MeshConfig
    from tidal.train.sizing import request, request_key

    recipe = load_recipe(TINY, {"train.resources.launcher": "gke", "train.resources.accelerator.kind": "tpu",
                                "train.resources.accelerator.type": "v5e",
                                "train.resources.accelerator.topology": "2x2"})
    train, acc = recipe.train, recipe.train.resources.accelerator

    def key(mesh):
        return request_key(request(train.model_copy(update={"mesh": mesh}), 4096, 127, acc))

    assert key(None) == key(MeshConfig(data=1, fsdp=4, tensor=1)) == key(MeshConfig(tensor=1))
    assert key(MeshConfig(data=2)) == key(MeshConfig(data=2, fsdp=2, tensor=1)) != key(None)


def test_write_keeps_line_endings_mode_and_a_missing_final_newline(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_bytes(b"name: r\r\ntrain:\r\n  steps: 10\r\n\r\n  batch_size: 16\r\nschedule: null")
    path.chmod(0o644)
    assert write_train_mesh(path, {"data": 2, "fsdp": 2, "tensor": 1}, 2)
    assert path.read_bytes() == (b"name: r\r\ntrain:\r\n  steps: 10\r\n\r\n  batch_size: 16\r\n"
                                 b"  mesh: {data: 2, fsdp: 2, tensor: 1}\r\n  microbatches: 2\r\nschedule: null\r\n")
    assert path.stat().st_mode & 0o777 == 0o644
    path.write_text("name: r\ntrain:\n  steps: 10")  # no final newline
    assert write_train_mesh(path, {"data": 1, "fsdp": 4, "tensor": 1}, 1)
    assert path.read_text() == "name: r\ntrain:\n  steps: 10\n  mesh: {data: 1, fsdp: 4, tensor: 1}\n"
    assert not write_train_mesh(path, {"data": 1, "fsdp": 4, "tensor": 1}, 1)  # already so: untouched


def test_write_keeps_the_trailing_comment_of_a_one_line_field(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train:\n  mesh: {tensor: 1}  # tensor fixed: heads\n  microbatches: 2 # fits v5e\n")
    assert write_train_mesh(path, {"data": 2, "fsdp": 2, "tensor": 1}, 4)
    assert path.read_text() == ("train:\n  mesh: {data: 2, fsdp: 2, tensor: 1}  # tensor fixed: heads\n"
                                "  microbatches: 4 # fits v5e\n")
