"""Parallelism: mesh shapes, layout rules, the multi-process environment contract, and real
sharded runs on 4 forced host devices and on 2 local processes over jax.distributed (gloo).

A sharded run computes the same math as a one-device run with the floating-point reductions
in another order, so losses agree to rounding only: every logged loss within ``LOSS_TOL``
(absolute, nats) of the one-device run. Measured on this machine: differences of at most
4.8e-7 nats (a few float32 ulps) over the 8 steps; the tolerance leaves a 100x margin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P
from test_train_e2e import CONFIG, build_inputs, fast_subprocesses, losses, make_ctx  # noqa: F401

import tidal.train
from tests.ports import free_port
from tidal.launch.local import run_entrypoint
from tidal.train import mesh as meshlib
from tidal.train.distributed import DistributedConfigError, launch_from_env
from tidal.train.packing import PACKED_KEY

STEPS = 8
RUN_CONFIG = dict(CONFIG, steps=STEPS, checkpoint_every=4, eval_every=4, log_every=1)
LOSS_TOL = 5e-5


# -- pure rules ------------------------------------------------------------------------

@pytest.mark.parametrize("devices, requested, slices, want", [
    (8, None, 1, {"data": 1, "fsdp": 8, "tensor": 1}),
    (8, {"tensor": 2}, 1, {"data": 1, "fsdp": 4, "tensor": 2}),
    (8, {"data": 2}, 1, {"data": 2, "fsdp": 4, "tensor": 1}),
    (16, None, 2, {"data": 2, "fsdp": 8, "tensor": 1}),
    (4, {"data": 2, "fsdp": 2, "tensor": 1}, 1, {"data": 2, "fsdp": 2, "tensor": 1}),
])
def test_mesh_shape(devices, requested, slices, want):
    assert meshlib.mesh_shape(devices, requested, slices) == want


@pytest.mark.parametrize("devices, requested, message", [
    (4, {"tensor": 3}, "do not divide the 4 devices"),
    (4, {"data": 2, "fsdp": 4, "tensor": 1}, "must equal the 4 devices"),
    (4, {"pipeline": 2}, "unknown axes \\['pipeline'\\]"),
    (4, {"fsdp": 0}, "'mesh.fsdp' must be a positive int"),
])
def test_mesh_shape_errors(devices, requested, message):
    with pytest.raises(meshlib.MeshError, match=message):
        meshlib.mesh_shape(devices, requested)


@pytest.mark.parametrize("path, shape, heads, want", [
    ("['block_0']['attn']['w_q']['kernel']", (32, 32), (4, 4), P("fsdp", "tensor")),
    ("['block_0']['attn']['w_k']['kernel']", (32, 16), (4, 2), P("fsdp", "tensor")),
    ("['block_0']['attn']['w_k']['kernel']", (32, 8), (4, 1), P("fsdp", None)),  # 1 kv head: not cut
    ("['block_0']['attn']['w_o']['kernel']", (32, 32), (4, 4), P("tensor", "fsdp")),
    ("['block_0']['mlp']['w_down']['kernel']", (64, 32), (4, 4), P("tensor", "fsdp")),
    ("['embed']['embedding']", (64, 32), (4, 4), P("fsdp", None)),
    ("['lm_head']['kernel']", (32, 63), (4, 4), P("fsdp", None)),  # 63 not divisible: next largest
    ("['final_norm']['scale']", (32,), (4, 4), P(None)),
    ("[1][0].mu['block_0']['mlp']['w_up']['kernel']", (32, 64), (4, 4), P("fsdp", "tensor")),
])
def test_param_spec(path, shape, heads, want):
    assert meshlib.param_spec(path, shape, {"data": 1, "fsdp": 2, "tensor": 2}, heads) == want


def test_launch_from_env_reads_the_pod_contract():
    assert launch_from_env({}).mode == "single"
    assert launch_from_env({"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "1"}).mode == "tpu"
    assert launch_from_env({"TPU_WORKER_HOSTNAMES": "h0"}).mode == "single"  # one-host slice
    assert launch_from_env({"MEGASCALE_COORDINATOR_ADDRESS": "c:8080"}).mode == "tpu"
    got = launch_from_env({"JAX_COORDINATOR_ADDRESS": "w-0.js:8476", "JAX_NUM_PROCESSES": "4",
                           "JAX_PROCESS_ID": "3"})
    assert (got.mode, got.coordinator, got.num_processes, got.process_id) == ("explicit", "w-0.js:8476", 4, 3)
    with pytest.raises(DistributedConfigError, match="needs JAX_COORDINATOR_ADDRESS"):
        launch_from_env({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"})
    with pytest.raises(DistributedConfigError, match="must be in \\[0, JAX_NUM_PROCESSES=2\\)"):
        launch_from_env({"JAX_COORDINATOR_ADDRESS": "a:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"})


def test_pod_specs_set_the_variables_read_here():
    from tidal.launch.pods import _coordinator_env

    names = {e["name"] for e in _coordinator_env("js", "workers", 2)}
    assert names == {"JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"}


# -- real sharded runs -----------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    inputs = build_inputs(root / "inputs")
    ref = make_ctx(root / "ref", inputs, RUN_CONFIG)
    tidal.train.run(ref)  # one process, one CPU device
    return root, inputs, losses(ref.out_dir)


def assert_close(got, want):
    assert [s for s, _ in got] == [s for s, _ in want] == list(range(1, STEPS + 1))
    worst = max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True))
    assert worst <= LOSS_TOL, (worst, got, want)
    assert got[-1][1] < 0.8 * got[0][1]  # it trained


def test_four_device_meshes_match_one_device(setup):
    root, inputs, want = setup
    meshes = {"2x2": {"fsdp": 2, "tensor": 2}, "4x1": {"fsdp": 4, "tensor": 1}, "dp2": {"data": 2, "fsdp": 2}}
    dirs = {}
    for name, mesh in meshes.items():
        ctx = make_ctx(root / name, inputs, dict(RUN_CONFIG, mesh=mesh))
        tidal.train.write_spec(ctx)
        dirs[name] = ctx.out_dir
    script = textwrap.dedent(f"""
        import json, sys
        from tidal.train.trainer import load_spec, train
        for d in {json.dumps([str(d) for d in dirs.values()])}:
            train(d, load_spec(d))
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "data=1 fsdp=2 tensor=2 (4 devices" in proc.stdout
    assert "data=1 fsdp=4 tensor=1 (4 devices" in proc.stdout
    assert "data=2 fsdp=2 tensor=1 (4 devices" in proc.stdout
    for name, out in dirs.items():
        assert_close(losses(out), want)
        shape = meshlib.mesh_shape(4, meshes[name])
        want_mesh = " ".join(f"{axis}={shape[axis]}" for axis in meshlib.AXES)
        assert json.loads((out / "summary.json").read_text())["mesh"] == want_mesh


def run_two_processes(step_dir: Path) -> list[str]:
    """Run the entrypoint on ``step_dir`` as processes 0 and 1 of a jax.distributed run over
    local CPU (the pod env contract); assert both exit 0 and return their outputs."""
    port = free_port()
    procs = []
    for pid in range(2):
        env = {"JAX_PLATFORMS": "cpu", "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
               "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(pid)}
        procs.append(subprocess.Popen([sys.executable, "-m", "tidal.train", str(step_dir)],
                                      env={**os.environ, **env}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    return outputs


def test_two_processes_over_jax_distributed_match_one_process(setup):
    root, inputs, want = setup
    ctx = make_ctx(root / "two-processes", inputs, RUN_CONFIG)
    tidal.train.write_spec(ctx)
    outputs = run_two_processes(ctx.out_dir)
    assert "joined distributed run: process 0 of 2" in outputs[0]
    assert "joined distributed run: process 1 of 2" in outputs[1]
    assert "step 1/" not in outputs[1]  # only process 0 reports progress
    batch = RUN_CONFIG["batch_size"]  # each process read only its own half of every batch
    assert f"process 0 of 2 reads rows 0:{batch // 2} of each batch of {batch}" in outputs[0], outputs[0][-2000:]
    assert f"process 1 of 2 reads rows {batch // 2}:{batch} of each batch of {batch}" in outputs[1], outputs[1][-2000:]
    assert_close(losses(ctx.out_dir), want)
    summary = json.loads((ctx.out_dir / "summary.json").read_text())
    assert summary["mesh"] == "data=1 fsdp=2 tensor=1"
    assert summary["checkpoint_step"] == STEPS  # saved by both processes through orbax, verified
    # a single process restores the two-process checkpoint into its own layout, bit for bit
    run_entrypoint(ctx.out_dir)
    again = json.loads((ctx.out_dir / "summary.json").read_text())
    assert again["params_sha256"] == summary["params_sha256"] and again["mesh"] == "data=1 fsdp=1 tensor=1"


def packed_steps(step_dir: Path) -> dict[int, bool]:
    """``{step: saved in the packed layout}`` of the checkpoints under ``step_dir``."""
    with ocp.CheckpointManager(step_dir / "checkpoints", item_handlers=ocp.PyTreeCheckpointHandler()) as manager:
        return {step: PACKED_KEY in (manager.item_metadata(step).custom_metadata or {})
                for step in manager.all_steps()}


def test_two_processes_resume_a_packed_single_process_checkpoint(setup):
    """The reverse of the test above: one CPU process saves packed checkpoints (module
    docstring of tidal.train.checkpoints), then a 2-process run restores them, each process
    placing its own shards, and continues."""
    root, inputs, want = setup
    ctx = make_ctx(root / "packed-resume", inputs, RUN_CONFIG)
    tidal.train.write_spec(ctx)
    run_entrypoint(ctx.out_dir, extra_args=["--stop-after", "6"])  # one process; last checkpoint: 4
    assert packed_steps(ctx.out_dir) == {4: True}  # really saved packed
    outputs = run_two_processes(ctx.out_dir)
    assert all("resumed from checkpoint step 4" in out for out in outputs), outputs[0][-3000:]
    got = losses(ctx.out_dir)
    assert got[:4] == want[:4]  # written by the one-process run, kept bitwise; 5.. recomputed
    assert_close(got, want)  # steps 5..8 on the 2-process mesh: equal to rounding (LOSS_TOL)
    summary = json.loads((ctx.out_dir / "summary.json").read_text())
    assert summary["mesh"] == "data=1 fsdp=2 tensor=1" and summary["checkpoint_step"] == STEPS
    # the restore itself is exact: 2 processes restoring the uninterrupted run's packed final
    # checkpoint (nothing left to train) report the same parameter hash, bit for bit
    done = root / "packed-final"
    shutil.copytree(root / "ref", done)
    assert packed_steps(done)[STEPS]
    outputs = run_two_processes(done)
    assert all(f"resumed from checkpoint step {STEPS}" in out for out in outputs), outputs[0][-3000:]
    again = json.loads((done / "summary.json").read_text())
    ref = json.loads((root / "ref" / "summary.json").read_text())
    assert again["params_sha256"] == ref["params_sha256"] and again["mesh"] == "data=1 fsdp=2 tensor=1"
