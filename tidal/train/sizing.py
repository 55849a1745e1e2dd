"""Size a training run before booking a chip: HBM, FLOPs, collectives, step time and MFU per chip.

A TPU run is sized from its real train step compiled ahead of time for its slice
(:mod:`tidal.train.aot`, in a process of its own that loads libtpu from ``TIDAL_LIBTPU_DIR``, which
``tools/tpu/install.sh`` fills); everything else, and a TPU run on a machine without libtpu, from the
analytical plan of :mod:`tidal.train.memory` and :mod:`tidal.train.flops`, and the record says which.

A sizing is a pure function of its request (the train step's config, vocabulary, context, the slice, the
versions of jax, libtpu and this module's record), so it is kept by that content under
``TIDAL_SIZING_CACHE``: a second ``tidal size`` or ``tidal plan`` of the same recipe compiles nothing.

The predicted step time is a roofline with no overlap of communication (which errs long) and one
interconnect figure per chip for every collective (which errs either way; DCN between slices is not
modelled, so a multislice prediction is optimistic):
``max(flops / peak, bytes accessed / HBM bandwidth) + wire bytes / ICI bandwidth``, each per chip (chip
constants: :mod:`tidal.train.chips`). MFU is the model's FLOPs per step (:func:`tidal.train.flops.flops_per_token`
times tokens, the count MFU uses everywhere in tidal; PaLM, Appendix B) over that time at peak.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from tidal.launch.resources import tpu_slice
from tidal.settings import current
from tidal.train.chips import Chip, chip
from tidal.train.flops import flops_per_token
from tidal.train.memory import MemoryPlanError, MeshShape, check_recipe, default_mesh, plan_memory
from tidal.train.roofline import hardware_flops, traffic

RECORD_VERSION = 1  # bump when the record (tidal/train/aot.py) changes meaning: it is part of the cache key
LIBTPU_VERSION = "0.0.42.1"  # tools/tpu/install.sh; the locked jax's `tpu` extra asks for 0.0.42.*
COMPILE_TIMEOUT_S = 3600.0
# what of a train config the compiled step depends on (its input step names, seed and schedule's parent do not)
SIZED_FIELDS = ("model", "optimizer", "steps", "batch_size", "microbatches", "mesh", "divergence")
# the code a compiled step is made of: a change to any of these is a new sizing
SIZED_CODE = ("aot.py", "build.py", "model.py", "moe.py", "mesh.py", "optimizer.py", "config.py")
GIB, MIB = 2**30, 2**20
# the TPU compiler's refusal: "... the total memory required for HLO temporaries (77.81G) exceeds available HBM"
_TEMPORARIES = re.compile(r"HLO temporaries \(([0-9.]+)([KMGT])\)")
_UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class SizingError(RuntimeError):
    """The sizer could not run (its process failed or timed out); the message says why and where."""


def libtpu_dir() -> Path:
    """Where the sizer finds the ``libtpu`` package: ``TIDAL_LIBTPU_DIR``, else tools/tpu/install.sh's folder
    (``$TIDAL_TOOLS_CACHE/libtpu-<version>``, the tools cache defaulting to ``~/.cache/tidal/tools``)."""
    settings = current()
    if settings.libtpu_dir:
        return Path(settings.libtpu_dir)
    tools = Path(settings.tools_cache) if settings.tools_cache else Path.home() / ".cache" / "tidal" / "tools"
    return tools / f"libtpu-{LIBTPU_VERSION}"


def libtpu_version() -> str:
    """The version of the libtpu in :func:`libtpu_dir` (its ``dist-info``), or :data:`LIBTPU_VERSION`."""
    found = sorted(libtpu_dir().glob("libtpu-*.dist-info"))
    return found[-1].name.removeprefix("libtpu-").removesuffix(".dist-info") if found else LIBTPU_VERSION


def libtpu_installed() -> bool:
    """True when :func:`libtpu_dir` holds ``libtpu/libtpu.so``."""
    return (libtpu_dir() / "libtpu" / "libtpu.so").is_file()


def request(train: Any, vocab_size: int, context: int, accelerator: Any) -> dict[str, Any]:
    """The content a sizing is a function of: the train config's :data:`SIZED_FIELDS` (its mesh resolved to
    the three axis sizes, so a default mesh and the same one written out share a sizing), the vocabulary,
    the context, the accelerator and the versions of what compiles it.

    Args:
        train: the recipe's ``train`` section or a train step's parsed config (:class:`tidal.train.config.TrainConfig`).
        vocab_size: the tokenizer's vocabulary size.
        context: tokens per sequence the model sees (``tokenize.seq_len - 1``).
        accelerator: the recipe's ``train.resources.accelerator`` (:class:`tidal.launch.config.AcceleratorConfig`).
    """
    if accelerator.kind == "tpu":  # one key per slice however it is named (v5e or tpu-v5-lite-podslice)
        tpu, _ = tpu_slice(accelerator.type, accelerator.topology)
        acc = {"kind": "tpu", "type": tpu.gke_accelerator, "topology": accelerator.topology,
               "slices": accelerator.slices, "chip": chip(tpu.gke_accelerator).name}
    else:
        acc = {"kind": accelerator.kind, "type": accelerator.type, "count": accelerator.count,
               "nodes": accelerator.nodes}
        if accelerator.kind == "gpu":
            acc["chip"] = chip(accelerator.type).name
    config = train.model_dump(mode="json", include=set(SIZED_FIELDS))
    if accelerator.kind in ("tpu", "gpu"):  # the mesh as the trainer resolves it: one program, one key
        chips = (tpu_slice(accelerator.type, accelerator.topology)[1].chips * accelerator.slices
                 if accelerator.kind == "tpu" else accelerator.count * accelerator.nodes)
        with contextlib.suppress(MemoryPlanError):  # a mesh that cannot fit: size_step refuses it (ConfigError)
            config["mesh"] = mesh_dict(default_mesh(chips, accelerator.slices, config.get("mesh")))
    return {"config": config, "vocab_size": int(vocab_size), "context": int(context), "accelerator": acc,
            "versions": _versions()}


@functools.cache
def _versions() -> dict[str, Any]:
    """What compiles a sizing besides its config: this record's version, the libraries (read without
    importing them), libtpu's version and a digest of :data:`SIZED_CODE`."""
    here = Path(__file__).parent
    code = hashlib.sha256(b"".join((here / name).read_bytes() for name in SIZED_CODE)).hexdigest()[:16]
    libs = {name: metadata.version(name) for name in ("jax", "jaxlib", "flax", "optax")}
    return {"record": RECORD_VERSION, **libs, "libtpu": libtpu_version(), "code": code}


def request_key(req: dict[str, Any]) -> str:
    """sha256 of the request's canonical JSON: the sizing's cache key."""
    return hashlib.sha256(json.dumps(req, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _cache_dir() -> Path:
    configured = current().sizing_cache
    return Path(configured) if configured else Path.home() / ".cache" / "tidal" / "sizing"


def _sizer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(libtpu_dir()), env.get("PYTHONPATH", "")) if p)
    # libtpu's one-process-per-machine lock guards real chips; compile-only devices need none, and a
    # lockfile left by a killed sizer would make the next one fail
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    return env


def cached_record(req: dict[str, Any]) -> dict[str, Any] | None:
    """The compiler's record for ``req`` if a sizing of it is in the cache, else None (nothing is compiled)."""
    path = _cache_dir() / f"{request_key(req)}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # absent, unreadable or torn: a miss (the sizer writes by rename)
        return None


def compiled_record(req: dict[str, Any], *, timeout_s: float = COMPILE_TIMEOUT_S,
                    progress: Any = None) -> tuple[dict[str, Any], bool]:
    """The compiler's record for a TPU request, from the cache or a sizer process; ``(record, cached)``.

    Raises:
        SizingError: the sizer process failed or ran past ``timeout_s`` (its last lines in the message).
    """
    path = _cache_dir() / f"{request_key(req)}.json"
    cached = cached_record(req)
    if cached is not None:
        return cached, True
    acc = req["accelerator"]
    if progress is not None:
        progress(f"sizing: compiling the train step for {acc['chip']} {acc['topology']} ahead of time "
                 f"(libtpu {LIBTPU_VERSION}; seconds for small models, minutes for billions of parameters)")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "tidal.train.aot"], input=json.dumps(req), env=_sizer_env(),
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SizingError(f"the sizer compiled for {acc['chip']} {acc['topology']} for more than {timeout_s:.0f} s "
                          "and was stopped") from None
    line = next((x for x in done.stdout.splitlines() if x.startswith("SIZING ")), None)
    if done.returncode != 0 or line is None:
        tail = "; ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise SizingError(f"the sizer (python -m tidal.train.aot) exited {done.returncode}: {tail[-800:]}")
    record = json.loads(line.removeprefix("SIZING "))
    record["wall_s"] = round(time.monotonic() - started, 1)
    if "error" not in record:  # a config the slice refuses is not kept: the recipe will change
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, sort_keys=True))
        tmp.replace(path)
    return record, False


@dataclass
class Sizing:
    """One train step sized for its accelerator: bytes per chip, FLOPs, collectives and the prediction.

    Attributes:
        step: the train step's name.
        chip: the chip's constants.
        where: ``"v5e 4x4 (16 chips, 4 hosts)"``.
        method: ``"compiled"`` (the TPU compiler's figures) or ``"analytical"`` (:mod:`tidal.train.memory`).
        note: why a sizing is analytical, or ``""``.
        mesh: the mesh sizes the step was sized on.
        chips: chips of the run (all slices).
        parts: bytes per chip by part: ``params``, ``optimizer``, ``batch and outputs``, ``temporaries``
            (compiled: activations, gradients and scratch) or ``gradients``, ``activations`` (analytical).
        total_bytes: peak bytes per chip.
        flops_per_chip: FLOPs of one step on one chip (compiled, or analytical when not compiled).
        model_flops_per_chip: the model's FLOPs per step per chip (:func:`tidal.train.flops.flops_per_token`).
        bytes_accessed: HBM bytes one chip reads and writes per step (compiled only; 0 otherwise).
        collectives: per kind ``{"count", "buffer_bytes", "wire_bytes"}`` per chip (compiled only).
        tokens_per_step: ``batch_size * context``.
        refusal: the TPU compiler's own refusal line, or None.
        compile_s: seconds the compile took when it ran (the cached figure on a cache hit).
        cached: True when the record came from the sizing cache.
        sequences_per_chip: sequences one chip computes at once (``batch / (data * fsdp * microbatches)``).
        usable_bytes: what ``total_bytes`` must stay within: the chip's HBM for a compiled program (the
            compiler has already kept its own reserve), the analytical plan's usable share otherwise.
        estimate_bytes, estimate_fits: the analytical plan's peak per chip and verdict, which recipe
            validation (``tidal plan``, the DAG) refuses by on every machine.
    """

    step: str
    chip: Chip
    where: str
    method: str
    note: str
    mesh: dict[str, int]
    chips: int
    parts: dict[str, int]
    total_bytes: int
    flops_per_chip: float
    model_flops_per_chip: float
    tokens_per_step: int
    bytes_accessed: float = 0.0
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    refusal: str | None = None
    compile_s: float | None = None
    cached: bool = False
    sequences_per_chip: int = 0
    usable_bytes: int = 0
    estimate_bytes: int = 0
    estimate_fits: bool = True

    @property
    def fits(self) -> bool:
        """True when the compiler accepted the step and its peak is within one chip's HBM."""
        return self.refusal is None and self.total_bytes <= (self.usable_bytes or self.chip.hbm_bytes)

    @property
    def compiled(self) -> bool:
        """True when the figures are the compiled program's (the TPU compiler accepted it)."""
        return self.method == "compiled" and self.refusal is None

    @property
    def wire_bytes(self) -> float:
        """Bytes one chip sends per step over all collectives (ring model, :mod:`tidal.train.aot`)."""
        return sum(row["wire_bytes"] for row in self.collectives.values())

    @property
    def predicted(self) -> dict[str, float]:
        """``compute_s``, ``hbm_s``, ``collective_s``, ``step_s`` (seconds per step), ``mfu`` (fraction) and
        ``tokens_per_s`` (all chips), by the roofline of the module docstring."""
        c = self.chip
        compute = self.flops_per_chip / c.peak_bf16_flops
        hbm = self.bytes_accessed / c.hbm_bytes_per_s
        wire = self.wire_bytes / c.ici_bytes_per_s
        step = max(compute, hbm) + wire
        return {"compute_s": compute, "hbm_s": hbm, "collective_s": wire, "step_s": step,
                "mfu": self.model_flops_per_chip / (step * c.peak_bf16_flops) if step > 0 else 0.0,
                "tokens_per_s": self.tokens_per_step / step if step > 0 else 0.0}

    def largest_part(self) -> tuple[str, int]:
        """The part with the most bytes per chip: ``(name, bytes)``."""
        return max(self.parts.items(), key=lambda kv: kv[1])

    def refusal_line(self) -> str:
        """One line: the chip, the figure, its largest part and what to change (for a run that does not fit)."""
        part, size = self.largest_part()
        if part in ("params", "optimizer", "gradients"):
            change = ("shard the state over more chips (a larger topology, or train.mesh with more fsdp) or use a "
                      "smaller model")
        else:
            change = (f"raise train.microbatches (each chip computes {self.sequences_per_chip} sequences at once now), "
                      "cut train.batch_size or tokenize.seq_len, or spread the batch over more chips (a larger "
                      "topology)")
        figure = (f"the TPU compiler refused it ({self.refusal})" if self.refusal is not None else
                  f"it needs {self.total_bytes / GIB:.2f} GiB per chip")
        return (f"{self.step} on {self.where} does not fit: {figure}; {self.chip.name} has "
                f"{self.chip.hbm_bytes / GIB:.2f} GiB HBM per chip; largest part {part} {size / GIB:.2f} GiB per chip; "
                f"{change}")

    def describe(self) -> list[str]:
        """The sizing as lines of text (``tidal size`` and ``tidal plan`` print them)."""
        m = self.mesh
        lines = [(f"{self.step}  {self.where}, mesh data={m['data']} fsdp={m['fsdp']} tensor={m['tensor']}, "
                  f"{self.tokens_per_step:,} tokens per step")]
        how = (f"compiled for {self.chip.name} by libtpu {LIBTPU_VERSION}"
               + (f" in {self.compile_s:.0f} s" if self.compile_s is not None else "")
               + (" (cached)" if self.cached else "")) if self.method == "compiled" else f"analytical: {self.note}"
        lines.append(f"  {how}")
        if self.refusal is not None:
            lines.append(f"  the compiler refused it: {self.refusal}")
        else:
            parts = " + ".join(f"{name} {bytes_text(size)}" for name, size in self.parts.items())
            share = self.total_bytes / self.chip.hbm_bytes
            lines.append(f"  HBM per chip: {parts} = {bytes_text(self.total_bytes)} of "
                         f"{bytes_text(self.chip.hbm_bytes)} ({share:.1%})")
        ratio = self.flops_per_chip / self.model_flops_per_chip if self.model_flops_per_chip else float("nan")
        if self.compiled:
            flops = (f"{self.flops_per_chip:.3g} compiled, {self.model_flops_per_chip:.3g} the model's "
                     f"(x{ratio:.2f}: recomputation, softmax, norms, optimizer)")
        elif self.flops_per_chip != self.model_flops_per_chip:
            flops = f"{self.flops_per_chip:.3g} with recomputation, {self.model_flops_per_chip:.3g} the model's"
        else:
            flops = f"{self.model_flops_per_chip:.3g} (the model's)"
        lines.append(f"  FLOPs per chip per step: {flops}")
        if self.collectives:
            kinds = ", ".join(f"{kind} {int(row['count'])}x {row['wire_bytes'] / MIB:.1f} MiB"
                              for kind, row in self.collectives.items() if row["count"])
            lines.append(f"  collectives per chip per step (bytes on the wire): {kinds or 'none'}")
        if self.refusal is None:
            p = self.predicted
            how = "" if self.compiled else "; the analytical traffic of tidal/train/roofline.py"
            lines.append(f"  predicted step {p['step_s'] * 1e3:.2f} ms (compute {p['compute_s'] * 1e3:.2f} at peak, "
                         f"HBM {p['hbm_s'] * 1e3:.2f}, collectives {p['collective_s'] * 1e3:.2f}, not "
                         f"overlapped{how}): MFU {p['mfu']:.1%}, {p['tokens_per_s']:,.0f} tokens/s")
        if self.method == "compiled" and self.estimate_fits != self.fits:
            lines.append(f"  the analytical estimate, which tidal plan and the DAG check on every machine, says "
                         f"{bytes_text(self.estimate_bytes)} and {'accepts' if self.estimate_fits else 'refuses'} it")
        lines.append("  fits" if self.fits else "  does not fit")
        return lines

    def as_json(self) -> dict[str, Any]:
        """The sizing as a JSON-able dict (``tidal size --json``): every attribute, the chip's name, the
        prediction and ``fits``."""
        return {"step": self.step, "chip": self.chip.name, "where": self.where, "method": self.method,
                "note": self.note, "mesh": self.mesh, "chips": self.chips, "parts_bytes": self.parts,
                "total_bytes": self.total_bytes, "hbm_bytes": self.chip.hbm_bytes, "fits": self.fits,
                "flops_per_chip": self.flops_per_chip, "model_flops_per_chip": self.model_flops_per_chip,
                "bytes_accessed": self.bytes_accessed, "collectives": self.collectives,
                "tokens_per_step": self.tokens_per_step, "predicted": self.predicted if self.refusal is None else None,
                "estimate_bytes": self.estimate_bytes, "estimate_fits": self.estimate_fits,
                "refusal": None if self.fits else self.refusal_line(), "compile_s": self.compile_s,
                "cached": self.cached}


def bytes_text(n: float) -> str:
    """Bytes as GiB from 1 GiB up, else MiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def _where(acc: dict[str, Any], chips: int) -> str:
    if acc["kind"] == "tpu":
        _, topo = tpu_slice(acc["type"], acc["topology"])
        slices = f" x {acc['slices']} slices" if acc["slices"] > 1 else ""
        hosts = topo.hosts * acc["slices"]
        return (f"{acc['chip']} {acc['topology']}{slices} ({chips} chip{'s' if chips > 1 else ''}, "
                f"{hosts} host{'s' if hosts > 1 else ''})")
    return (f"{acc['chip']} x {acc['count']} per node x {acc['nodes']} node{'s' if acc['nodes'] > 1 else ''} "
            f"({chips} GPUs)")


def size_step(step: str, req: dict[str, Any], model_cfg: Any, *, progress: Any = None,
              timeout_s: float = COMPILE_TIMEOUT_S, record: tuple[dict[str, Any], bool] | None = None,
              compile_missing: bool = True) -> Sizing:
    """Size one train step from its :func:`request` (``model_cfg``: its :class:`tidal.train.flops.ModelShape`);
    ``record``: the compiler's ``(record, cached)`` when the caller has it (else compiled or read here, or with
    ``compile_missing`` False the analytical sizing: nothing is compiled).

    Raises:
        SizingError: the sizer process failed.
        tidal.train.config.ConfigError: the slice refuses the config (a mesh that does not divide it).
        tidal.train.chips.UnknownChip: an accelerator with no constants.
    """
    from tidal.train.config import ConfigError

    acc = req["accelerator"]
    c = chip(acc["chip"])
    cfg = req["config"]
    batch, context = int(cfg["batch_size"]), req["context"]
    tokens = batch * context
    model_flops = flops_per_token(model_cfg, context) * tokens
    if acc["kind"] == "tpu":
        _, topo = tpu_slice(acc["type"], acc["topology"])
        chips = topo.chips * acc["slices"]
    else:
        chips = acc["count"] * acc["nodes"]
    where = _where(acc, chips)
    micro = int(cfg.get("microbatches", 1))
    try:
        mesh = default_mesh(chips, acc.get("slices", 1), cfg.get("mesh"))
    except MemoryPlanError as err:  # train.mesh does not multiply to the slice's chips
        raise ConfigError(f"{step} on {where}: train.mesh {cfg.get('mesh')}: {err}") from None
    plan = plan_memory(model_cfg, batch_size=batch, seq_len=context, capacity_bytes=c.hbm_bytes, microbatches=micro,
                       mesh=mesh)
    if acc["kind"] == "tpu" and (record is not None or (compile_missing and libtpu_installed())):
        record, cached = record or compiled_record(req, timeout_s=timeout_s, progress=progress)
        if "error" in record:
            raise ConfigError(f"{step} on {where}: {record['error']}")
        params, optimizer = record["params_bytes"], record["optimizer_bytes"]
        if record["compiled"]:
            args_out = record["argument_bytes"] + record["output_bytes"] - record["alias_bytes"]
            parts = {"params": params, "optimizer": optimizer,
                     "batch and outputs": max(args_out - params - optimizer, 0), "temporaries": record["temp_bytes"]}
        else:  # what the compiler says the temporaries needed, when it says
            parts = {"params": params, "optimizer": optimizer}
            if match := _TEMPORARIES.search(record["compiler_refusal"]):
                parts["temporaries"] = int(float(match.group(1)) * _UNIT[match.group(2)])
        sizing = Sizing(step, c, where, "compiled", "", record["mesh"], chips, parts, sum(parts.values()),
                        record.get("flops", model_flops / chips), model_flops / chips, tokens,
                        record.get("bytes_accessed", 0.0), record.get("collectives", {}),
                        None if record["compiled"] else record["compiler_refusal"], record.get("compile_s"), cached)
    else:
        note = ("libtpu is not installed (make tpu-tools, or set TIDAL_LIBTPU_DIR)" if acc["kind"] == "tpu" else
                "GPU programs are not compiled here: the CUDA plugin needs a GPU to compile, so these are the "
                "analytical estimate of tidal/train/memory.py")
        parts = {"params": plan.params_bytes, "optimizer": plan.optimizer_bytes, "gradients": plan.grads_bytes,
                 "activations": plan.activation_bytes}
        mesh = mesh_dict(plan.mesh)
        hbm, moved = traffic(model_cfg, mesh, microbatches=micro, tokens_per_chip=plan.sequences_per_device * context,
                             activation_bytes=plan.activation_bytes)
        sizing = Sizing(step, c, where, "analytical", note, mesh, chips, parts, plan.total_bytes,
                        hardware_flops(model_cfg, model_flops) / chips, model_flops / chips, tokens, hbm, moved,
                        usable_bytes=int(plan.usable_fraction * plan.capacity_bytes))
    sizing.sequences_per_chip = math.ceil(batch / (sizing.mesh["data"] * sizing.mesh["fsdp"] * micro))
    sizing.estimate_bytes, sizing.estimate_fits = plan.total_bytes, plan.fits
    return sizing


_COMPILED_DECIDES: contextvars.ContextVar[bool] = contextvars.ContextVar("tidal_sizing_compiled_decides",
                                                                         default=False)


@contextlib.contextmanager
def compiled_decides() -> Iterator[None]:
    """While active, recipe validation does not refuse by the analytical plan: ``tidal size`` loads the
    recipe so that the compiler gives its verdict (the analytical plan errs both ways: tidal/train/memory.py)."""
    token = _COMPILED_DECIDES.set(True)
    try:
        yield
    finally:
        _COMPILED_DECIDES.reset(token)


def check_recipe_fits(recipe: Any) -> None:
    """Refuse a recipe whose training cannot fit its accelerator by the analytical plan
    (:func:`tidal.train.memory.check_recipe`): recipe validation (``tidal plan``, DAG parsing) gives the same
    answer on every machine, whatever its sizing cache holds. Skipped under :func:`compiled_decides`
    (``tidal size``, where the compiler gives its own verdict).

    Raises:
        tidal.train.memory.MemoryPlanError: every term in GiB and the capacity.
    """
    if not _COMPILED_DECIDES.get():
        check_recipe(recipe)


def mesh_dict(mesh: MeshShape) -> dict[str, int]:
    return {"data": mesh.data, "fsdp": mesh.fsdp, "tensor": mesh.tensor}


def step_request(step: Any, recipe: Any) -> tuple[dict[str, Any], Any]:
    """``(request, model shape)`` of a planned train ``step`` on ``recipe``'s accelerator (:func:`request`).

    Raises:
        tidal.train.chips.UnknownChip: an accelerator with no constants.
    """
    vocab = recipe.tokenizer.vocab_size
    req = request(step.typed_config, vocab, recipe.tokenize.seq_len - 1, recipe.train.resources.accelerator)
    return req, step.typed_config.model.shape(vocab)


def size_without_compiling(step: Any, recipe: Any) -> Sizing:
    """A train step's sizing that costs nothing: the compiled one when the cache holds it (a TPU slice), else
    the analytical one (``tidal plan`` and the GKE launch's check, :mod:`tidal.train.preflight`).

    Raises:
        tidal.train.chips.UnknownChip: an accelerator with no constants.
    """
    req, model_cfg = step_request(step, recipe)
    record = cached_record(req) if req["accelerator"]["kind"] == "tpu" else None
    return size_step(step.name, req, model_cfg, record=None if record is None else (record, True),
                     compile_missing=False)


def size_pipeline(pipe: Any, *, progress: Any = None) -> list[Sizing]:
    """Size every train step of a loaded pipeline (:func:`tidal.core.load.load_pipeline`) whose recipe names a
    TPU or GPU accelerator; ``[]`` for a CPU run (nothing to size against)."""
    if pipe.recipe.train.resources.accelerator.kind not in ("tpu", "gpu"):
        return []
    return [size_step(step.name, *step_request(step, pipe.recipe), progress=progress)
            for step in pipe.graph if step.kind == "train"]
