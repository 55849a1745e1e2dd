"""Reading a recipe's YAML files (the recipe, a suite, a licences file): regular files only (a device or
FIFO never read: ``/dev/zero`` would grow without end, a FIFO block), bounded size, duplicate keys,
anchors and aliases refused, syntax errors with line and column."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from tidal.config import RecipeError

MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML; 1 MiB leaves room for long source lists


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last one) and every
    anchor and alias: nested aliases expand ~1 KB of YAML into gigabytes (the "billion laughs"), and a
    recipe has no use for them (write the value out, or use overrides)."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise yaml.composer.ComposerError(
                None, None, f"YAML {kind}{str(event.anchor)[:40]} is not allowed in a recipe (write the value out)",
                event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):  # `? [a, b]` or `? {a: 1}`: unhashable in Python
                raise yaml.constructor.ConstructorError(
                    None, None, f"a mapping key must be a plain value, not a {key_node.id}", key_node.start_mark)
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def file_kind(mode: int) -> str:
    """What an ``os.stat`` mode is, in words (for errors)."""
    for test, kind in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def read_bounded(path: str | Path, what: str, limit: int = MAX_RECIPE_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes.

    Checked before it is opened (``os.stat``: a FIFO would block ``open``, a device never end) and again
    on the open file (``O_NONBLOCK``, ``fstat``: it may have been swapped in between); at most ``limit + 1``
    bytes are read whatever the file claims.

    Raises:
        RecipeError: unreadable, not a regular file, or larger than ``limit``.
    """
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise RecipeError(f"{path}: cannot read {what}: a {file_kind(mode)}, not a regular file "
                              f"(rule: a {what} file is a regular file)")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise RecipeError(f"{path}: cannot read {what}: a {file_kind(mode)}, not a regular file "
                                  f"(rule: a {what} file is a regular file)")
            data = handle.read(limit + 1)
    except OSError as err:
        raise RecipeError(f"{path}: cannot read {what}: {err.strerror or err}") from None
    if len(data) > limit:
        raise RecipeError(f"{path}: a {what} file is at most {limit} bytes, this one is larger")
    return data


def read_yaml(path: str | Path, what: str = "recipe") -> Any:
    """Parse a recipe or suite file: a regular file (:func:`read_bounded`) of at most :data:`MAX_RECIPE_BYTES`,
    no duplicate keys, no anchors or aliases (:class:`_UniqueKeyLoader`).

    Raises:
        RecipeError: unreadable, not a regular file, too large, or not such YAML (``path: line L, column C
        YAML ...``).
    """
    path = Path(path)
    try:
        text = read_bounded(path, what).decode()
    except UnicodeDecodeError as err:
        raise RecipeError(f"{path}: cannot read {what}: {err}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RecipeError(f"{path}:{where} YAML syntax error: {getattr(err, 'problem', err)}") from None
