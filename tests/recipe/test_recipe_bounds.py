"""Issue 43, item 7: numeric recipe fields whose runaway value costs money or never ends have a documented
upper bound checked at load (``tidal plan``), the tokenizer's vocabulary a lower one (the byte alphabet and
the special tokens), and the recipe name a length bound (it becomes file names and the DAG id); each a
one-line problem naming the field, instead of a traceback (or a Rust abort) steps later."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from tidal.recipe import RecipeError, parse_recipe


def with_value(tiny_data, dotted: str, value):
    data = copy.deepcopy(tiny_data)
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


@pytest.mark.parametrize(("dotted", "value"), [
    ("tokenizer.vocab_size", 1),  # was a traceback at the tokenizer step
    ("tokenizer.vocab_size", 256),  # 256 bytes, and no room for the end-of-text token
    ("tokenizer.vocab_size", 1_000_000_000_000),  # was a Rust panic (SIGABRT) at the tokenizer step
    ("train.steps", 10**30),  # was accepted, and trained without end
    ("train.batch_size", 10**9),
    ("train.eval_batches", 10**9),
    ("tokenize.shards", 10**6),
    ("mixture.shards", 10**6),
    ("mixture.n_sequences", 10**15),
    ("name", "a" * 300),  # was OSError: File name too long under tidal run
])
def test_a_runaway_value_is_refused_at_load_naming_the_field(tiny_data, dotted, value):
    with pytest.raises(RecipeError) as err:
        parse_recipe(with_value(tiny_data, dotted, value))
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].strip().startswith(f"{dotted}:"), str(err.value)


def test_a_runaway_token_budget_is_refused(tiny_data):
    data = with_value(tiny_data, "mixture.size", {"mode": "token_budget", "tokens": 10**20, "max_epochs": 2.0})
    with pytest.raises(RecipeError, match=r"mixture\.size\.token_budget\.tokens"):
        parse_recipe(data)


@pytest.mark.parametrize(("dotted", "value"), [
    ("tokenizer.vocab_size", 257), ("tokenizer.vocab_size", 1 << 20), ("train.steps", 10_000_000),
    ("train.batch_size", 65_536), ("tokenize.shards", 99_999), ("mixture.shards", 99_999), ("name", "a" * 100),
])
def test_values_up_to_the_bounds_are_accepted(tiny_data, dotted, value):
    data = with_value(tiny_data, dotted, value)
    if dotted == "train.steps":
        data["train"]["optimizer"] = {**data["train"].get("optimizer", {}), "warmup_steps": 1}
    parse_recipe(data)


def test_the_bounds_are_documented_in_the_schema(capsys):
    from tidal.cli import main

    assert main(["recipe-schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    defs = schema["$defs"]
    for where, field in ((defs["TokenizerSettings"], "vocab_size"), (defs["TrainSection"], "steps"),
                         (defs["TrainSection"], "batch_size"), (defs["TokenizeSettings"], "shards"),
                         (defs["MixtureSettings"], "shards"), (schema, "name")):
        prop = where["properties"][field]
        found = json.dumps(prop)
        assert ("maximum" in found or "maxLength" in found) and "at most" in prop["description"], (field, prop)
    assert defs["TokenizerSettings"]["properties"]["vocab_size"]["minimum"] == 257


def test_tidal_plan_refuses_a_tiny_vocabulary_with_one_error_line(tmp_path, tiny_data):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(with_value(tiny_data, "tokenizer.vocab_size", 1), sort_keys=False))
    plan = subprocess.run([sys.executable, "-m", "tidal", "plan", str(recipe), "--storage-root", str(tmp_path / "s")],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert plan.returncode == 2, plan.stderr[-2000:]
    assert len([line for line in plan.stderr.splitlines() if line.startswith("error:")]) == 1
    assert "tokenizer.vocab_size" in plan.stderr and "Traceback" not in plan.stderr


def test_the_tokenizer_step_config_needs_room_for_its_special_tokens():
    from tidal.data.tokenizer_config import TokenizerConfig

    with pytest.raises(ValueError, match="vocab_size 258 .* 256 byte symbols and 3 special tokens"):
        TokenizerConfig(vocab_size=258, special_tokens=["<a>", "<b>", "<c>"])
    assert TokenizerConfig(vocab_size=259, special_tokens=["<a>", "<b>", "<c>"]).vocab_size == 259
    assert TokenizerConfig(mode="file", path="t.json", sha256="a" * 64, vocab_size=257,
                           special_tokens=["<a>", "<b>"]).mode == "file"  # only a trained BPE needs the room
