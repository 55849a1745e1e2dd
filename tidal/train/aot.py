"""Compile a recipe's training step for a TPU slice this machine does not have, and read what the compiler says.

``python -m tidal.train.aot`` reads one sizing request (JSON, :func:`tidal.train.sizing.request`) on stdin and
prints one JSON record on stdout. It runs in its own process because it loads libtpu
(:mod:`tidal.train.sizing` puts it on the path): training processes never load the TPU plugin.

The step compiled is the one that trains (:func:`tidal.train.build.train_functions`: model, AdamW, schedule),
jitted with the shardings the trainer uses (:mod:`tidal.train.mesh`) on a mesh of the slice's compile-only
devices (``jax.experimental.topologies.get_topology_desc``, as MaxText's ``train_compile.py`` does), with
abstract inputs only: nothing is materialized, so a 70B state sizes on a laptop. What comes back, per chip:

* memory: ``compiled.memory_analysis()`` (arguments, outputs, aliased donations, temporaries); the state's
  own share (parameters, optimizer state) from its shardings; the peak is ``arguments + outputs - aliased +
  temporaries`` (the sum MaxText's ``train_compile.py`` reports);
* FLOPs and HBM bytes accessed per chip: ``compiled.cost_analysis()``;
* collectives: every all-reduce, all-gather, reduce-scatter and all-to-all of the optimized HLO
  (``compiled.as_text()``), with the bytes each chip puts on the wire for a ring over its replica group:
  ``2(n-1)/n`` of the buffer for an all-reduce, ``(n-1)/n`` of the gathered (or scattered) buffer otherwise
  (Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce algorithms").

A TPU compiler that refuses the program for want of HBM (``RESOURCE_EXHAUSTED``) is a result, not a crash:
the record says ``compiled: false`` and carries the compiler's line.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from typing import Any

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
               "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
# `%name = <result type> <opcode>(<operands>), ...`; async collectives print as `<opcode>-start`
_INSTRUCTION = re.compile(r"=\s*(?P<result>.+?)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?:-start)?\((?P<args>.*)$")
_ARRAY = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([0-9,]*)\]")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([0-9,]*)\}")
# libtpu 0.0.42 prints groups over a device mesh: mesh['axis_0'=4,'axis_1'=1] {'axis_0'} is groups of 4
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%([\w.-]+)\s")
# TPU reduce-scatters are custom fusions: `fusion(...), kind=kCustom, calls=%all-reduce-scatter.3`
_CALLED = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%([\w.-]+)")
_BODY = re.compile(r"\bwhile\(.*body=%([\w.-]+)")
_FUSED_SCATTER = re.compile(r"=\s*(?P<result>.+?)\s+fusion\(.*calls=%(?P<comp>all-reduce-scatter[\w.-]*)")


def _array_bytes(text: str) -> list[int]:
    """Bytes of every array type written in ``text`` (``bf16[1024,512]{1,0}`` -> 1,048,576)."""
    return [DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
            for dtype, dims in _ARRAY.findall(text)]


def _group_size(line: str, devices: int) -> int | None:
    """Devices in each replica group of an instruction, None when it names none."""
    if match := _MESH_GROUPS.search(line):
        try:
            sizes = {k.strip().strip("'"): int(v) for k, v in (x.split("=") for x in match.group(1).split(","))}
            return math.prod(sizes[a.strip().strip("'")] for a in match.group(2).split(",") if a.strip())
        except (KeyError, ValueError):  # a form this parser does not know (sub-axes): every device
            return None
    if match := _IOTA_GROUPS.search(line):
        return int(match.group(2))
    if (match := _LIST_GROUPS.search(line)) and match.group(1):
        return len(match.group(1).split(","))
    return None


def collectives(hlo_text: str, devices: int, loop_passes: int = 1) -> dict[str, dict[str, float]]:
    """Collectives of an optimized HLO module, by kind: ``{"all-gather": {"count", "buffer_bytes",
    "wire_bytes"}, ...}`` per chip (formulas in the module docstring). Each instruction counts once, or
    ``loop_passes`` times inside the one loop a step has (the microbatch scan; tidal's model unrolls its
    layers). A TPU reduce-scatter is a custom
    fusion calling an ``all-reduce-scatter`` computation: its call counts, with the scattered result times
    the group as its buffer, and the all-reduce inside that computation does not.

    Args:
        hlo_text: ``compiled.as_text()`` of one device's program.
        devices: devices of the program (the group of an instruction that names none).
        loop_passes: times the program's while loop runs (the microbatch scan): what a loop body and the
            computations it calls hold counts that many times.
    """
    out = {kind: {"count": 0, "buffer_bytes": 0, "wire_bytes": 0.0} for kind in COLLECTIVES}
    scatter_groups: dict[str, int] = {}
    calls: dict[str, set[str]] = {}
    bodies: set[str] = set()
    lines, computation = [], ""
    for line in hlo_text.splitlines():
        if match := _COMPUTATION.match(line):
            computation = match.group(1)
        lines.append((computation, line))
        calls.setdefault(computation, set()).update(_CALLED.findall(line))
        bodies.update(_BODY.findall(line))
        if computation.startswith("all-reduce-scatter") and (n := _group_size(line, devices)):
            scatter_groups[computation] = n
    in_loop, todo = set(), list(bodies)
    while todo:
        name = todo.pop()
        if name not in in_loop:
            in_loop.add(name)
            todo.extend(calls.get(name, ()))

    def add(kind: str, buffer: int, n: int, times: int) -> None:
        row = out[kind]
        row["count"] += times
        row["buffer_bytes"] += times * buffer
        row["wire_bytes"] += times * (2 if kind == "all-reduce" else 1) * (n - 1) / n * buffer

    for computation, line in lines:
        times = loop_passes if computation in in_loop else 1
        if computation.startswith("all-reduce-scatter"):
            continue
        if match := _FUSED_SCATTER.search(line):
            n = scatter_groups.get(match.group("comp"), devices)
            if n > 1:
                add("reduce-scatter", n * sum(_array_bytes(match.group("result"))), n, times)
            continue
        match = _INSTRUCTION.search(line)
        if match is None:
            continue
        kind = match.group("op")
        result = _array_bytes(match.group("result"))
        if kind == "all-gather" and f"{kind}-start(" in line:
            result = result[len(result) // 2:]  # an async all-gather's tuple: its operands, then its results
        n = _group_size(line, devices) or devices
        if n <= 1 or not result:
            continue
        # an all-gather's buffer is what it gathers to (every result of a combined one), a reduce-scatter's
        # what it is given (n times its results); the others' their results
        add(kind, (n if kind == "reduce-scatter" else 1) * sum(result), n, times)
    return out


def _state_bytes(tree: Any) -> int:
    """Bytes one device holds of a tree of sharded ``ShapeDtypeStruct`` s (the largest shard of each leaf)."""
    import jax

    total = 0
    for leaf in jax.tree.leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * leaf.dtype.itemsize
    return total


# chips of one host (GKE's machine types, tidal/launch/resources.py) -> libtpu's chips_per_host_bounds
HOST_BOUNDS = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}


def topology_devices(accelerator: dict[str, Any]) -> list[Any]:
    """The compile-only devices of a TPU slice (``{"chip": "v5e", "type": ..., "topology": "4x4", "slices": 1}``),
    hosts shaped as GKE's machine types make them (libtpu's default, 2x2x1, cannot describe a 1x1 or 2x4 host)."""
    from jax.experimental import topologies

    from tidal.launch.resources import tpu_slice

    _, topo = tpu_slice(accelerator["type"], accelerator["topology"])
    kwargs: dict[str, Any] = {"chips_per_host_bounds": HOST_BOUNDS[topo.chips_per_host]}
    if accelerator.get("slices", 1) > 1:
        kwargs["num_slices"] = accelerator["slices"]
    name = f"{accelerator['chip']}:{accelerator['topology']}"
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name, **kwargs).devices)


def compile_step(request: dict[str, Any]) -> dict[str, Any]:
    """Compile the request's train step for its slice; the record :func:`tidal.train.sizing.Sizing` reads.

    Raises:
        tidal.train.config.ConfigError: the train config or its mesh does not fit the slice (one line).
    """
    import jax
    import jax.numpy as jnp

    from tidal.train import mesh as meshlib
    from tidal.train.build import guarded_step_fn, train_functions
    from tidal.train.config import ConfigError, parse_step_config

    started = time.monotonic()
    # the sized fields of a train config (tidal/train/sizing.py SIZED_FIELDS); its input names are placeholders
    cfg = parse_step_config({**request["config"], "train_data": "train", "tokenizer": "tokenizer"}, "sizing request")
    devices = topology_devices(request["accelerator"])
    context = int(request["context"])
    try:
        model_cfg = cfg.model.shape(int(request["vocab_size"]))
        requested = None if cfg.mesh is None else cfg.mesh.model_dump()
        sizes = meshlib.mesh_shape(len(devices), requested, request["accelerator"].get("slices", 1))
        mesh = meshlib.make_mesh(sizes, devices)
        meshlib.check_batch(cfg.batch_size, mesh)
        meshlib.check_batch(cfg.batch_size // cfg.microbatches, mesh)
    except ValueError as err:  # MeshError, a vocabulary the model refuses
        raise ConfigError(f"train: {err}") from None
    init, step_fn, _, _ = train_functions(cfg, model_cfg, context)
    abstract = jax.eval_shape(init, jax.random.key(0))
    shardings = meshlib.state_shardings(abstract, mesh, (model_cfg.n_heads, model_cfg.kv_heads))
    state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    batch_layout = meshlib.batch_sharding(mesh)
    batch = jax.ShapeDtypeStruct((cfg.batch_size, context + 1), jnp.int32, sharding=batch_layout)
    index = jax.ShapeDtypeStruct((), jnp.int32)
    # as the trainer jits it on an accelerator: the old state donated, the divergence guard's step when the
    # config has one (tidal/train/build.py)
    args: tuple[Any, ...] = (state, batch, index)
    if cfg.divergence is not None:
        step_fn = guarded_step_fn(step_fn, cfg.divergence.action == "skip")
        args += (jax.ShapeDtypeStruct((), jnp.float32),)
    jitted = jax.jit(step_fn, in_shardings=(shardings, batch_layout) + (None,) * (len(args) - 2),
                     out_shardings=(shardings, meshlib.replicated(mesh)), donate_argnums=(0,))
    lowered = jitted.lower(*args)
    record: dict[str, Any] = {
        "mesh": sizes, "devices": len(devices), "device_kind": devices[0].device_kind,
        "params_bytes": _state_bytes(state["params"]), "optimizer_bytes": _state_bytes(state["opt_state"]),
        "jax": jax.__version__,
    }
    try:
        compiled = lowered.compile()
    except Exception as err:  # the compiler's refusal for want of HBM is the answer; anything else is re-raised
        text = str(err)
        if "RESOURCE_EXHAUSTED" not in text:
            raise
        line = next((x.strip() for x in text.splitlines() if "RESOURCE_EXHAUSTED" in x), text.splitlines()[0])
        return {**record, "compiled": False, "compiler_refusal": line[:600],
                "compile_s": round(time.monotonic() - started, 1)}
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    # XLA's cost analysis counts a loop body once: with microbatches the step is that many passes of the scan's
    # body, so its FLOPs and bytes are scaled by them (counting the one update m times too: an upper bound)
    passes = cfg.microbatches
    return {**record, "compiled": True, "compile_s": round(time.monotonic() - started, 1),
            "argument_bytes": int(memory.argument_size_in_bytes), "output_bytes": int(memory.output_size_in_bytes),
            "alias_bytes": int(memory.alias_size_in_bytes), "temp_bytes": int(memory.temp_size_in_bytes),
            "flops": passes * float(cost.get("flops", 0.0)),
            "bytes_accessed": passes * float(cost.get("bytes accessed", 0.0)),
            "collectives": collectives(compiled.as_text(), len(devices), loop_passes=passes)}


def main() -> int:
    """Read a request on stdin, print its record (or ``{"error": ...}`` for a config the slice refuses)."""
    from tidal.train.config import ConfigError

    request = json.loads(sys.stdin.read())
    try:
        record = compile_step(request)
    except ConfigError as err:
        record = {"error": str(err)}
    print("SIZING " + json.dumps(record, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
