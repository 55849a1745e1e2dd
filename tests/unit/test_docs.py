"""Every shell and YAML block in the docs is either checked by a test or marked as illustrative.

Walks the fenced blocks of ``README.md`` and ``docs/**/*.md`` whose language is bash, sh, shell,
console, yaml or yml. The line just before a block's opening fence may carry a marker:

* ``<!-- illustrative -->``: shown for reading only (cloud commands, placeholders);
* ``<!-- tested: tests/path.py::test_name -->``: that test exists and reads or runs what the block
  shows; :func:`test_command_blocks_name_real_commands` is such a test for blocks of commands.

An unmarked YAML block must parse, and when it is a recipe (top-level ``name`` and ``sources`` or
``train``) or a fragment of one (a top-level key that is a recipe field), it must validate as a
recipe: a fragment is put into ``recipes/tiny.yaml`` section by section first, so a misspelt key
beside a real one is refused. An unmarked shell block fails.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
YAML = {"yaml", "yml"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^<!--\s*(?:(?P<illustrative>illustrative)|tested:\s*(?P<test>\S+?)::(?P<name>\w+))\s*-->$")
THIS = "tests/unit/test_docs.py"


@dataclass(frozen=True)
class Block:
    """A fenced block: the file, the line of its opening fence (1-based), language, text, and the
    line before the fence (stripped), where a marker goes."""

    path: Path
    line: int
    lang: str
    text: str
    before: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def marker(self) -> re.Match[str] | None:
        return MARKER.match(self.before)


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file (indented fences in list items too)."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = FENCE.match(lines[j])
            if closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence) \
                    and not lines[j].strip()[len(closing["fence"]):].strip():
                break
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        before = lines[i - 1].strip() if i > 0 else ""
        found.append(Block(path, i + 1, opening["lang"].lower(), "\n".join(body) + "\n", before))
        i = j + 1
    return found


BLOCKS = [b for path in DOCS for b in fenced_blocks(path) if b.lang in SHELL | YAML]


def _defines(test_file: Path, name: str) -> bool:
    tree = ast.parse(test_file.read_text())
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name for node in tree.body)


def _tiny() -> dict:
    return yaml.safe_load((REPO / "recipes" / "tiny.yaml").read_text())


def _validate_recipe_yaml(block: Block, data: object) -> None:
    """A whole recipe validates as it is; a fragment (a recipe field at the top) validates inside
    the tiny recipe, each section it gives merged one level deep (``train: {model: ...}`` replaces
    the tiny recipe's model and keeps its other training fields)."""
    from tidal.recipe import Recipe, RecipeError, parse_recipe

    if not isinstance(data, dict):
        return
    if "name" in data and ({"sources", "train"} & set(data)):
        recipe = data
    elif set(data) & set(Recipe.model_fields):  # a fragment: a key that is no recipe field is refused below
        recipe = _tiny()
        for key, value in data.items():
            if isinstance(value, dict) and isinstance(recipe.get(key), dict):
                recipe[key] = {**recipe[key], **value}
            else:
                recipe[key] = value
    else:
        return
    try:
        parse_recipe(recipe, path=block.where)
    except RecipeError as err:
        pytest.fail(f"{block.where}: this YAML does not validate as a recipe (fix it, or mark it "
                    f"<!-- illustrative -->):\n{err}")


def test_the_docs_have_blocks_to_check():
    assert (REPO / "README.md").exists() and (REPO / "docs" / "index.md").exists()
    assert len(BLOCKS) >= 20, [b.where for b in BLOCKS]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_every_block_is_tested_or_illustrative(block: Block):
    if block.before.startswith("<!--") and block.marker is None:
        pytest.fail(f"{block.where}: unknown marker {block.before!r}: use <!-- illustrative --> or "
                    "<!-- tested: tests/path.py::test_name -->")
    marker = block.marker
    if marker is not None and marker["illustrative"]:
        return
    if marker is not None:
        test_file = REPO / marker["test"]
        assert test_file.is_file(), f"{block.where}: the marker names {marker['test']}, which does not exist"
        assert _defines(test_file, marker["name"]), \
            f"{block.where}: {marker['test']} defines no test {marker['name']}"
        return
    assert block.lang in YAML, (f"{block.where}: a {block.lang} block must be marked <!-- illustrative --> or "
                                "<!-- tested: tests/path.py::test_name --> on the line before its fence")
    try:
        data = yaml.safe_load(block.text)
    except yaml.YAMLError as err:
        pytest.fail(f"{block.where}: the YAML does not parse: {err}")
    _validate_recipe_yaml(block, data)


# --- blocks of commands ------------------------------------------------------------------------

def _commands(text: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped, split into words."""
    joined = re.sub(r"\\\n", " ", text)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def _make_targets() -> set[str]:
    targets: set[str] = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        rule = re.match(r"^([A-Za-z0-9_.\- ]+):(?!=)", line)
        if rule:
            targets.update(rule.group(1).split())
    return targets


def _check_command(words: list[str], where: str) -> None:
    """One command of a tested block is real: a ``tidal`` command line argparse accepts, a ``make``
    target of the Makefile, a ``python -m`` module or script, or a ``bash`` script that exists."""
    from tidal.cli import build_parser

    program = Path(words[0]).name
    args = words[1:]
    if program == "tidal":
        try:
            build_parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{where}: `{shlex.join(words)}`: tidal does not accept these arguments")
        for arg in args:
            if arg.endswith((".yaml", ".yml")) and "/" in arg and not arg.startswith(("/", "s3://")):
                assert (REPO / arg).exists(), f"{where}: `{shlex.join(words)}`: no file {arg}"
    elif program == "make":
        missing = [a for a in args if "=" not in a and not a.startswith("-") and a not in _make_targets()]
        assert not missing, f"{where}: `{shlex.join(words)}`: no make target {missing}"
    elif re.fullmatch(r"python3?(\.\d+)?", program):
        if args[:1] == ["-m"]:
            assert importlib.util.find_spec(args[1]) is not None, f"{where}: no module {args[1]}"
        else:
            assert (REPO / args[0]).is_file(), f"{where}: no script {args[0]}"
    elif program == "bash":
        assert (REPO / args[0]).is_file(), f"{where}: no script {args[0]}"
        if "--" in args:
            _check_command(args[args.index("--") + 1:], where)
    else:
        pytest.fail(f"{where}: `{shlex.join(words)}`: this test checks tidal, make, python and bash commands; "
                    "mark the block <!-- illustrative --> instead")


def test_command_blocks_name_real_commands():
    """The blocks marked with this test: every command in them names a real command, target, module
    or script, and every ``tidal`` line parses with the CLI's own parser."""
    mine = [b for b in BLOCKS if b.marker is not None and b.marker["test"] == THIS
            and b.marker["name"] == "test_command_blocks_name_real_commands"]
    assert mine, "no block is marked as checked by this test"
    for block in mine:
        commands = _commands(block.text)
        assert commands, f"{block.where}: no command in the block"
        for words in commands:
            _check_command(words, block.where)
