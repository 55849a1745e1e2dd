"""Recipe validation: every error names the file, the field's dotted path and the reason."""

from __future__ import annotations

import pytest

from tests.conftest import TINY
from tidal.recipe import RecipeError, load_recipe, parse_recipe


def test_tiny_recipe_is_valid():
    recipe = load_recipe(TINY)
    assert recipe.train_sources == ["brown", "gcide", "songci"]
    assert recipe.eval_sources == ["udhr"]
    for source in recipe.sources.values():
        assert len(source.archive.sha256) == 64 and source.licence and source.archive.version


def test_unknown_field_is_refused_with_its_path(tiny_data):
    tiny_data["train"]["optimizer"]["learning_rate"] = 0.1
    with pytest.raises(RecipeError) as err:
        parse_recipe(tiny_data, "tiny.yaml")
    assert "tiny.yaml" in str(err.value)
    assert "train.optimizer.learning_rate: unknown field" in str(err.value)


@pytest.mark.parametrize(
    ("dotted", "value", "expected"),
    [
        ("train.steps", 0, "train.steps: Input should be greater than 0"),
        ("train.optimizer.lr", -1.0, "train.optimizer.lr: Input should be greater than 0"),
        ("tokenize.seq_len", 4, "tokenize.seq_len: Input should be greater than or equal to 8"),
        ("clean.normalization", "NFD", "clean.normalization: Input should be 'NFC' or 'NFKC'"),
        ("sources.brown.archive.sha256", "abc", "sources.brown.archive.sha256: String should match pattern"),
        ("name", "Tiny Recipe", "name: String should match pattern"),
    ],
)
def test_bad_values_name_the_field(tiny_data, dotted, value, expected):
    with pytest.raises(RecipeError) as err:
        parse_recipe(tiny_data, "tiny.yaml", overrides={dotted: value})
    assert expected in str(err.value)
    assert repr(value) in str(err.value)


def test_cross_field_rules(tiny_data):
    tiny_data["mixture"]["weights"]["wiki"] = 0.5
    with pytest.raises(RecipeError, match=r"mixture.weights names unknown sources \['wiki'\]"):
        parse_recipe(tiny_data, "tiny.yaml")
    tiny_data["mixture"]["weights"].pop("wiki")
    tiny_data["evaluation"]["sources"] = ["brown"]
    with pytest.raises(RecipeError, match=r"\['brown'\] are both in the training mixture and held out"):
        parse_recipe(tiny_data, "tiny.yaml")


def test_model_shape_rule(tiny_data):
    with pytest.raises(RecipeError, match="d_model .130. must be divisible by n_heads .4."):
        parse_recipe(tiny_data, "t.yaml", overrides={"train.model.d_model": 130})


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsources: [a\n")
    with pytest.raises(RecipeError, match=r"bad.yaml: line \d+, column \d+ YAML syntax error"):
        load_recipe(bad)


def test_missing_file():
    with pytest.raises(RecipeError, match="cannot read recipe"):
        load_recipe("/nonexistent/recipe.yaml")


def test_duplicate_yaml_key_is_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(TINY.read_text().replace("seed: 20261130", "seed: 20261130\nseed: 7"))
    with pytest.raises(RecipeError, match=r"dup.yaml: line \d+, column \d+ YAML syntax error: duplicate key 'seed'"):
        load_recipe(path)


def _alias_bomb(levels: int = 12) -> str:
    """~1 KB of YAML whose aliases expand to 10**levels strings (the "billion laughs")."""
    lines = ['a0: &a0 "lol"']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nname: *a{levels}\n"


def test_yaml_anchors_and_aliases_are_refused_before_they_expand(tmp_path):
    """Issue 22, item 5: nested aliases made `tidal plan` use gigabytes and minutes, and the DAG file
    stalled on such a file for every recipe."""
    import resource
    import time

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb())
    assert bomb.stat().st_size < 2000
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tick = time.perf_counter()
    with pytest.raises(RecipeError, match=r"bomb.yaml: line 1, column 5 YAML syntax error: YAML anchor &a0 is not "
                                          r"allowed in a recipe \(write the value out\)$"):
        load_recipe(bomb)
    assert time.perf_counter() - tick < 1.0  # refused while composing, before anything expands
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB
    alias_only = tmp_path / "alias.yaml"
    alias_only.write_text(TINY.read_text() + "\nextra: *nowhere\n")
    with pytest.raises(RecipeError, match=r"alias.yaml: line \d+, column 8 YAML syntax error: YAML alias \*nowhere"):
        load_recipe(alias_only)


def test_a_recipe_file_over_the_size_cap_is_refused_unread(tmp_path):
    from tidal.recipe.loader import MAX_RECIPE_BYTES

    big = tmp_path / "big.yaml"
    big.write_text(TINY.read_text() + "#" * MAX_RECIPE_BYTES)
    with pytest.raises(RecipeError, match=rf"big.yaml: a recipe file is at most {MAX_RECIPE_BYTES} bytes"):
        load_recipe(big)


def test_booleans_and_numeric_strings_are_not_integers(tiny_data):
    with pytest.raises(RecipeError, match="train.steps: Input should be a valid integer"):
        parse_recipe(tiny_data, "t.yaml", overrides={"train.steps": True})
    with pytest.raises(RecipeError, match=r"gate.min_total_tokens: .*YAML read '1e12' as text"):
        parse_recipe(tiny_data, "t.yaml", overrides={"gate.min_total_tokens": "1e12"})


def test_empty_recipe(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(RecipeError, match="empty.yaml: the recipe is empty"):
        load_recipe(tmp_path / "empty.yaml")


def test_cross_field_error_has_no_pydantic_prefix(tiny_data):
    tiny_data["mixture"]["weights"]["wiki"] = 0.5
    with pytest.raises(RecipeError) as err:
        parse_recipe(tiny_data, "t.yaml")
    assert "Value error" not in str(err.value)


@pytest.mark.parametrize("scheme", ["gs", "https", "hdfs"])
def test_a_source_uri_the_fetch_step_cannot_read_is_one_error_at_load(tiny_data, tmp_path, scheme):
    """Not a traceback from the fetch step's planning: the loader names the file, the field and the scheme."""
    import yaml

    tiny_data["sources"]["notes"] = {"format": "jsonl", "path": f"{scheme}://bucket/notes/", "licence": "MIT"}
    path = tmp_path / "uri.yaml"
    path.write_text(yaml.safe_dump(tiny_data))
    want = rf"uri.yaml: sources.notes.path: {scheme}://bucket/notes/: {scheme}:// source paths are not supported"
    with pytest.raises(RecipeError, match=want + r" \(local paths and s3:// only"):
        load_recipe(path)
