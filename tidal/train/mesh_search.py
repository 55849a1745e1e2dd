"""Choose a train step's mesh and microbatch count for its slice (``tidal size --search``), and write the
choice into the recipe (``--write``).

The candidates are every ``data x fsdp x tensor`` factorization of the slice's chips that the trainer
can run, each with the fewest microbatches that fit: the counts are tried in increasing order and a
mesh stops at the first that fits, because more microbatches only add loop passes (each gathers the
parameters again under FSDP) and shrink the matmuls, so the least count that fits is the fastest by the
roofline of :mod:`tidal.train.sizing`. Every candidate is compiled for the slice (one sizer process each,
kept in the sizing cache, so a second search compiles again only what the compiler could not finish)
and the ones that fit are ranked by
predicted MFU, then by HBM per chip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.config import RecipeError
from tidal.train.config import ConfigError, MeshConfig
from tidal.train.sizing import Sizing, SizingError, bytes_text, libtpu_installed, request, size_step

AXES = ("data", "fsdp", "tensor")


@dataclass
class Candidate:
    """One configuration tried: its mesh, microbatch count and sizing (``sizing`` None: ``error`` says why
    the sizer refused the configuration outright)."""

    mesh: dict[str, int]
    microbatches: int
    sizing: Sizing | None
    error: str = ""

    @property
    def fits(self) -> bool:
        return self.sizing is not None and self.sizing.fits

    @property
    def mfu(self) -> float:
        return self.sizing.predicted["mfu"] if self.fits and self.sizing.compiled else 0.0

    def as_json(self) -> dict[str, Any]:
        return {"mesh": self.mesh, "microbatches": self.microbatches, "fits": self.fits, "error": self.error or None,
                "sizing": None if self.sizing is None else self.sizing.as_json()}


def meshes(chips: int, slices: int, model_cfg: Any, batch_size: int,
           fixed: dict[str, int | None] | None = None) -> list[dict[str, int]]:
    """Every mesh ``{"data", "fsdp", "tensor"}`` over ``chips`` chips that the trainer can run, in a fixed order
    (data, then fsdp, ascending).

    Rules (:mod:`tidal.train.mesh`): ``data * fsdp * tensor == chips``; ``data`` a multiple of ``slices``
    (only data parallelism crosses the DCN between slices); ``tensor`` divides every head count and
    ``d_ff`` (else :func:`tidal.train.mesh.param_spec` replicates the kernels along it: tensor parallelism
    in name only); ``data * fsdp`` divides ``batch_size`` (the batch is sharded over both). An axis set in
    ``fixed`` (the recipe's ``train.mesh``) keeps its size.
    """
    fixed = {axis: size for axis, size in (fixed or {}).items() if size is not None}
    heads = {model_cfg.n_heads, model_cfg.kv_heads}
    out = []
    for data in range(1, chips + 1):
        for fsdp in range(1, chips // data + 1):
            if chips % (data * fsdp):
                continue
            mesh = {"data": data, "fsdp": fsdp, "tensor": chips // (data * fsdp)}
            tensor = mesh["tensor"]
            if data % slices or batch_size % (data * fsdp) or model_cfg.d_ff % tensor:
                continue
            if any(h % tensor for h in heads) or any(mesh[a] != size for a, size in fixed.items()):
                continue
            out.append(mesh)
    return out


def microbatch_counts(batch_size: int, mesh: dict[str, int]) -> list[int]:
    """The microbatch counts a mesh allows, ascending: the divisors of the sequences each ``data x fsdp``
    shard of the batch holds (``batch_size / (data * fsdp)``), so every microbatch is whole on every chip."""
    per_shard = batch_size // (mesh["data"] * mesh["fsdp"])
    return [m for m in range(1, per_shard + 1) if per_shard % m == 0]


def search_step(step: str, train: Any, vocab_size: int, context: int, accelerator: Any, model_cfg: Any, *,
                progress: Callable[[str], None] | None = None) -> list[Candidate]:
    """Size every candidate of one train step (``train``: its :class:`tidal.train.config.TrainConfig`) on
    ``accelerator`` and rank them: those that fit first, by predicted MFU then HBM per chip, then the rest.

    Raises:
        RecipeError: not a TPU slice, or libtpu not installed (a search compares compiled programs).
    """
    if accelerator.kind != "tpu" or not libtpu_installed():
        why = ("libtpu is not installed (make tpu-tools, or set TIDAL_LIBTPU_DIR)" if accelerator.kind == "tpu"
               else f"training runs on {accelerator.kind}: only TPU programs are compiled here")
        raise RecipeError(f"tidal size --search compiles every candidate for the slice, and {why}")
    from tidal.launch.resources import tpu_slice

    _, topo = tpu_slice(accelerator.type, accelerator.topology)
    chips = topo.chips * accelerator.slices
    fixed = train.mesh.model_dump() if train.mesh is not None else {}
    found = meshes(chips, accelerator.slices, model_cfg, train.batch_size, fixed)
    if not found:
        raise RecipeError(f"{step}: no mesh of the {chips} chips divides train.batch_size {train.batch_size} with "
                          f"tensor dividing the heads and d_ff{' and keeps train.mesh ' + str(fixed) if fixed else ''}")
    if progress:
        fixed_note = f" ({', '.join(f'{a}={v}' for a, v in fixed.items() if v)} fixed by train.mesh)" if any(
            fixed.values()) else " (set an axis in train.mesh, e.g. --set train.mesh.tensor=1, to try fewer)"
        meshes_text = f"{len(found)} mesh{'es' if len(found) != 1 else ''}"
        progress(f"search: {meshes_text} of the {chips} chips{fixed_note}, each compiled with its fewest "
                 "microbatches that fit")
    out: list[Candidate] = []
    for i, mesh in enumerate(found, 1):
        for m in microbatch_counts(train.batch_size, mesh):
            if progress:
                progress(f"search {i}/{len(found)}: data={mesh['data']} fsdp={mesh['fsdp']} tensor={mesh['tensor']} "
                         f"microbatches={m}")
            cfg = train.model_copy(update={"mesh": MeshConfig(**mesh), "microbatches": m})
            req = request(cfg, vocab_size, context, accelerator)
            try:
                candidate = Candidate(mesh, m, size_step(step, req, model_cfg, progress=progress))
            except (ConfigError, SizingError) as err:  # refused outright, or its sizer failed: the others go on
                candidate = Candidate(mesh, m, None, str(err).splitlines()[0])
            out.append(candidate)
            if candidate.fits or candidate.sizing is None:
                break
    return sorted(out, key=lambda c: (not c.fits, -c.mfu, c.sizing.total_bytes if c.sizing else 0))


def describe(step: str, candidates: list[Candidate]) -> list[str]:
    """The search as lines of text: a ranked table of what fits, then what did not and why."""
    fitting = [c for c in candidates if c.fits]
    where = next((c.sizing.where for c in candidates if c.sizing is not None), "")
    plural = "s" if len(candidates) != 1 else ""
    lines = [f"{step}  {where}: {len(candidates)} configuration{plural} tried, {len(fitting)} fit"]
    if fitting:
        lines.append("  rank  data  fsdp  tensor  microbatches  HBM per chip        predicted step    MFU")
    for rank, c in enumerate(fitting, 1):
        s, m = c.sizing, c.mesh
        p = s.predicted
        hbm = f"{bytes_text(s.total_bytes)} ({s.total_bytes / s.chip.hbm_bytes:.1%})"
        lines.append(f"  {rank:<4}  {m['data']:<4}  {m['fsdp']:<4}  {m['tensor']:<6}  {c.microbatches:<12}  "
                     f"{hbm:<18}  {p['step_s'] * 1e3:9.2f} ms  {p['mfu']:6.1%}")
    for c in candidates:
        if not c.fits:
            m = c.mesh
            why = c.error or (c.sizing.refusal or f"needs {bytes_text(c.sizing.total_bytes)} per chip")
            lines.append(f"  does not fit: data={m['data']} fsdp={m['fsdp']} tensor={m['tensor']} "
                         f"microbatches={c.microbatches}: {why}")
    return lines


def write_choice(recipe_path: str | Path, chosen: Candidate, default: dict[str, int] | None = None) -> bool:
    """Set ``train.mesh`` (all three axes) and ``train.microbatches`` in the recipe file to ``chosen`` by
    editing only those lines of its ``train:`` block, so every other line (comments, flow mappings, wrapping)
    stays as it was; a ``mesh:`` block written out over several lines is replaced by one flow line, with its
    own comments. Nothing is written when the file sets neither field and ``chosen`` is what the trainer
    derives anyway (``default``, the mesh of an unset ``train.mesh``, and one microbatch): the mesh is
    hashed, so writing the default out would give the train step a new id for the same program. The file
    is replaced atomically, and the result is checked: parsed, it is the old file with those fields set.

    Returns:
        True when the file was changed.

    Raises:
        RecipeError: the file is not a mapping, or its ``train`` is written in flow style (edit it by hand).
    """
    import os
    import re
    import tempfile

    import yaml

    path = Path(recipe_path)
    text = path.read_text()
    before = yaml.safe_load(text)
    if not isinstance(before, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of fields; --write cannot edit this file")
    train_before = before.get("train") or {}
    if not isinstance(train_before, dict):
        raise RecipeError(f"{path}: train is not a mapping; --write cannot edit it")
    unset = "mesh" not in train_before and "microbatches" not in train_before
    if unset and chosen.mesh == default and chosen.microbatches == 1:
        return False
    mesh_line = "mesh: {" + ", ".join(f"{axis}: {chosen.mesh[axis]}" for axis in AXES) + "}"
    fields = {"mesh": mesh_line}
    if chosen.microbatches != 1 or "microbatches" in train_before:
        fields["microbatches"] = f"microbatches: {chosen.microbatches}"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(r"train:\s*(#.*)?$", line)), None)
    if start is None:
        if "train" in before:
            raise RecipeError(f"{path}: train is written in flow style; set train.mesh and train.microbatches by hand")
        lines += ([] if not lines or lines[-1].endswith("\n") else ["\n"]) + ["train:\n"]
        start = len(lines) - 1
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"[^\s#]", lines[i])), len(lines))
    body = [i for i in range(start + 1, end) if lines[i].strip() and not lines[i].lstrip().startswith("#")]
    indent = (len(lines[body[0]]) - len(lines[body[0]].lstrip())) if body else 2
    pad = " " * indent
    for key, line in fields.items():
        at = next((i for i in range(start + 1, end) if re.match(rf"{pad}{key}:(\s|$)", lines[i])), None)
        if at is None:
            last = body[-1] if body else start
            while last + 1 < end and lines[last + 1].startswith(pad + " "):  # the last field's own block
                last += 1
            lines.insert(last + 1, f"{pad}{line}\n")
            end += 1
        else:
            stop = at + 1
            while stop < end and (not lines[stop].strip() or lines[stop].startswith(pad + " ")):
                stop += 1
            lines[at:stop] = [f"{pad}{line}\n"]
            end -= stop - at - 1
        body = [i for i in range(start + 1, end) if lines[i].strip() and not lines[i].lstrip().startswith("#")]
    out = "".join(lines)
    after = yaml.safe_load(out)
    want = {**before, "train": {**train_before, "mesh": dict(chosen.mesh),
                                **({"microbatches": chosen.microbatches} if "microbatches" in fields else {})}}
    if after != want:
        raise RecipeError(f"{path}: --write could not edit its train block safely; set train.mesh to "
                          f"{chosen.mesh} and train.microbatches to {chosen.microbatches} by hand")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(out)
    os.replace(tmp, path)
    return True
