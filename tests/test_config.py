"""tidal/config.py: the base of every config model and the one formatter of its refusals."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from tests.conftest import TINY
from tidal.cli import main
from tidal.config import SHOWN_INPUT_CHARS, PositiveInt, Strict, problems
from tidal.recipe import RecipeError, parse_recipe


class Box(Strict):
    steps: PositiveInt = 1
    rate: float = 0.5


def test_a_refused_value_is_echoed_cut_to_a_readable_length():
    with pytest.raises(ValidationError) as err:
        Box(steps="x" * 5000)
    (line,) = problems(err.value)
    assert line.startswith("steps: Input should be a valid integer (got 'xxx")
    assert len(line) < SHOWN_INPUT_CHARS + 120 and "(5,002 characters)" in line


def test_infinite_and_nan_floats_are_refused_at_load(tiny_data):
    with pytest.raises(ValidationError):
        Box(rate=float("inf"))
    tiny_data["train"]["optimizer"]["weight_decay"] = float("inf")
    with pytest.raises(RecipeError, match=r"train\.optimizer\.weight_decay: .*finite"):
        parse_recipe(tiny_data)


def test_explain_prints_the_derived_seed_of_a_seeded_step_only(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    data = yaml.safe_load(TINY.read_text())
    data["storage_root"] = str(tmp_path / "store")
    recipe.write_text(yaml.safe_dump(data))
    from tidal.core.planner import build_graph
    from tidal.steps import derive_seed

    mix = build_graph(parse_recipe(data))["mix"]
    assert main(["explain", str(recipe), "mix"]) == 0
    out = capsys.readouterr().out
    assert f"step seed: {derive_seed(data['seed'], 'mix')}" in out and mix.step_id in out
    assert main(["explain", str(recipe), "clean-brown"]) == 0
    assert "step seed" not in capsys.readouterr().out
