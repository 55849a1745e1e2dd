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
from typing import Any

from tidal.config import RecipeError
from tidal.train.config import ConfigError, MeshConfig
from tidal.train.sizing import Sizing, SizingError, bytes_text, libtpu_installed, request, size_step


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
