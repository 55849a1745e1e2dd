"""Set fields of a recipe's ``train:`` block in its file as text (``tidal size --search --write``), so that every
other byte of the file stays as the person wrote it: comments, flow mappings, wrapping, line endings.
A YAML round trip (PyYAML, ruamel.yaml) rewraps long flow mappings and reindents sequences, which is why
this edits lines and then proves the edit by parsing.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from pathlib import Path

import yaml

from tidal.config import RecipeError
from tidal.recipe.yaml_file import _UniqueKeyLoader

AXES = ("data", "fsdp", "tensor")


def _parse(text: str, path: Path, what: str) -> object:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: --write cannot edit {what}: {str(err).splitlines()[0]}; set train.mesh and "
                          "train.microbatches by hand") from None


def write_train_mesh(recipe_path: str | Path, mesh: dict[str, int], microbatches: int,
                     default_mesh: dict[str, int] | None = None) -> bool:
    """Set ``train.mesh`` (all three axes, one flow-style line) and ``train.microbatches`` in the recipe file by
    editing only those lines of its ``train:`` block. A ``mesh:`` block written over several lines becomes
    one line (its own comments go with it). ``microbatches`` is written when it is not 1 or the file names a
    count. Nothing is written when the file sets neither field and ``mesh`` is ``default_mesh`` (the mesh of
    an unset ``train.mesh``) with one microbatch: the mesh is hashed, so writing the default out would give
    the train step a new id for the same program.

    The result must parse (duplicate keys refused, as recipe loading refuses them) to the old document with
    those fields set; the file is replaced by rename, keeping its mode and its line endings.

    Returns:
        True when the file changed.

    Raises:
        RecipeError: the file does not parse, is not a mapping, writes ``train`` in flow style, or the edit
            could not be proven (one line saying to set the fields by hand).
    """
    path = Path(recipe_path)
    with open(path, newline="") as f:
        text = f.read()
    before = _parse(text, path, "the file as it is")
    if not isinstance(before, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of fields; --write cannot edit this file")
    train_before = before.get("train") or {}
    if not isinstance(train_before, dict):
        raise RecipeError(f"{path}: train is not a mapping; --write cannot edit it")
    if "mesh" not in train_before and "microbatches" not in train_before and mesh == default_mesh \
            and microbatches == 1:
        return False
    newline = "\r\n" if "\r\n" in text else "\n"
    fields = {"mesh": "mesh: {" + ", ".join(f"{axis}: {mesh[axis]}" for axis in AXES) + "}"}
    if microbatches != 1 or "microbatches" in train_before:
        fields["microbatches"] = f"microbatches: {microbatches}"
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += newline
    start = next((i for i, line in enumerate(lines) if re.match(r"train:[ \t]*(#.*)?\r?\n?$", line)), None)
    if start is None:
        if "train" in before:
            raise RecipeError(f"{path}: train is not a block of its own lines (flow style?); set train.mesh and "
                              "train.microbatches by hand")
        lines.append(f"train:{newline}")
        start = len(lines) - 1
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"[^\s#]", lines[i])), len(lines))

    def fields_at() -> list[int]:
        return [i for i in range(start + 1, end) if lines[i].strip() and not lines[i].lstrip().startswith("#")]

    body = fields_at()
    indent = (len(lines[body[0]]) - len(lines[body[0]].lstrip())) if body else 2
    pad = " " * indent
    for key, line in fields.items():
        at = next((i for i in range(start + 1, end) if re.match(rf"{pad}{key}:(\s|$)", lines[i])), None)
        if at is None:
            last = body[-1] if body else start
            while last + 1 < end and (lines[last + 1].startswith(pad + " ") or not lines[last + 1].strip()):
                last += 1  # the last field's own block
            while last > (body[-1] if body else start) and not lines[last].strip():
                last -= 1  # blank lines stay after the block
            lines.insert(last + 1, f"{pad}{line}{newline}")
            end += 1
        else:
            stop = at + 1
            while stop < end and (not lines[stop].strip() or lines[stop].startswith(pad + " ")):
                stop += 1
            while stop > at + 1 and not lines[stop - 1].strip():
                stop -= 1  # blank lines after the block are the file's, not the mesh's
            # a one-line field's trailing comment stays (the values written hold no '#')
            comment = re.search(r"[ \t]+#.*$", lines[at].rstrip("\r\n")) if stop == at + 1 else None
            lines[at:stop] = [f"{pad}{line}{comment.group(0) if comment else ''}{newline}"]
            end -= stop - at - 1
        body = fields_at()
    out = "".join(lines)
    if out == text:
        return False
    want = {**before, "train": {**train_before, "mesh": dict(mesh),
                                **({"microbatches": microbatches} if "microbatches" in fields else {})}}
    with contextlib.suppress(RecipeError):
        if _parse(out, path, "the edited file") == want:
            _replace(path, out)
            return True
    raise RecipeError(f"{path}: --write could not edit its train block safely; set train.mesh to {mesh} and "
                      f"train.microbatches to {microbatches} by hand")


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` (same mode, flushed to disk), then rename it over."""
    mode = stat.S_IMODE(path.stat().st_mode)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
