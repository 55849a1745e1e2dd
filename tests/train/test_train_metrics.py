"""Training metrics: memory and MFU helpers, ``--profile`` mode, and live MLflow logging that
survives a tracking-server outage (real ``mlflow server`` on loopback, killed mid-run and
restarted on the same port and store)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from test_train_e2e import CONFIG, build_inputs, fast_subprocesses, make_ctx  # noqa: F401

import tidal.train
from tests.storage.servers import free_port, kill_mlflow_server, start_mlflow_server
from tidal.launch.local import entrypoint_command, run_entrypoint
from tidal.train import flops
from tidal.train.metrics import device_memory, model_flops_utilisation, peak_flops


def test_device_memory_on_cpu_is_process_rss():
    import jax.numpy as jnp

    before = device_memory()
    block = jnp.ones((64, 1024, 1024), jnp.float32).block_until_ready()  # 256 MiB
    after = device_memory()
    assert before["memory_source"] == after["memory_source"] == "rss"  # CPU devices report no stats
    assert after["memory_bytes"] - before["memory_bytes"] > 200 * 2**20
    assert after["peak_memory_bytes"] >= after["memory_bytes"]
    del block


def test_mfu_uses_the_flops_table_and_is_none_without_a_peak():
    cfg = flops.ModelShape(vocab_size=4096, d_model=128, n_layers=2, n_heads=4, d_ff=512)
    assert peak_flops("cpu", 1) is None and model_flops_utilisation(1e5, cfg, 127, None) is None
    peak = peak_flops("NVIDIA H100 80GB HBM3", 8)
    assert peak == 8 * flops.peak_flops_per_s("NVIDIA H100 80GB HBM3")
    got = model_flops_utilisation(1e6, cfg, 127, peak)
    assert got == pytest.approx(1e6 * flops.flops_per_token(cfg, 127) / peak, rel=1e-12)


def test_profile_mode_writes_profile_json_and_commits_nothing(tmp_path):
    inputs = build_inputs(tmp_path / "inputs")
    ctx = make_ctx(tmp_path / "train", inputs)
    tidal.train.write_spec(ctx)
    run_entrypoint(ctx.out_dir, extra_args=["--profile", "6"])
    profile = json.loads((ctx.out_dir / "profile.json").read_text())
    assert profile["steps"] == 6 and profile["step_time_s"] > 0
    assert profile["tokens_per_second"] == pytest.approx(8 * 32 / profile["step_time_s"], rel=1e-9)
    assert profile["peak_memory_bytes"] > 0 and profile["mfu"] is None  # no CPU peak in the table
    assert profile["mesh"] == "data=1 fsdp=1 tensor=1" and profile["param_count"] == 24736
    assert not (ctx.out_dir / "summary.json").exists() and not (ctx.out_dir / "metrics.jsonl").exists()
    assert not (ctx.out_dir / "checkpoints").exists()


# -- tracking outage ---------------------------------------------------------------------

@pytest.mark.slow
def test_training_goes_on_through_a_tracking_outage_and_every_metric_arrives(tmp_path):
    from mlflow.tracking import MlflowClient

    steps = 1500
    inputs = build_inputs(tmp_path / "inputs")
    ctx = make_ctx(tmp_path / "train", inputs, dict(CONFIG, steps=steps, log_every=1, eval_every=500,
                                                    checkpoint_every=500))
    tidal.train.write_spec(ctx)
    port, store = free_port(), tmp_path / "store"
    store.mkdir()
    server = start_mlflow_server(port, store)
    uri = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_TRACKING_URI": uri,
           "TIDAL_MLFLOW_EXPERIMENT": "outage", "TIDAL_TRACKING_FLUSH_TIMEOUT_S": "300"}
    trainer = subprocess.Popen(entrypoint_command(ctx.out_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    lines: list[str] = []
    progress = [0]

    def read() -> None:
        for line in trainer.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("step "):
                progress.append(int(line.split()[1].split("/")[0]))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        run_file = ctx.out_dir / "mlflow_run.json"
        deadline = time.monotonic() + 300
        while (progress[-1] < 50 or not run_file.exists()) and trainer.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert run_file.exists() and progress[-1] >= 50, lines[-20:]
        kill_mlflow_server(server)
        assert progress[-1] < steps  # the server died while training was running
        time.sleep(2.0)  # training goes on meanwhile
        server = start_mlflow_server(port, store)
        assert trainer.wait(timeout=600) == 0, lines[-30:]
    finally:
        if trainer.poll() is None:
            trainer.kill()
        reader.join()
        kill_mlflow_server(server) if server.poll() is None else None
    text = "\n".join(lines)
    assert "unreachable" in text and "reachable again" in text, text[-3000:]
    server = start_mlflow_server(port, store)  # read back through the server
    try:
        client = MlflowClient(uri)
        run_id = json.loads(run_file.read_text())["run_id"]
        for key in ("loss", "tokens_per_second", "grad_norm"):
            history = client.get_metric_history(run_id, key)
            assert sorted(m.step for m in history) == list(range(1, steps + 1)), key
        run = client.get_run(run_id)
        summary = json.loads((ctx.out_dir / "summary.json").read_text())
        assert run.data.tags["tidal.checkpoint_root_hash"] == summary["checkpoint_root_hash"]
        assert run.info.status == "FINISHED"
    finally:
        kill_mlflow_server(server)


def test_rows_unsent_at_the_end_go_to_pending_and_replay(tmp_path):
    from mlflow.tracking import MlflowClient

    from tidal.tracking import Tracker
    from tidal.train.metrics import LiveMetrics

    good = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(good)
    run_id = client.create_run(client.create_experiment("replay")).info.run_id
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    live = LiveMetrics(dead, run_id, pending_dir=tmp_path / "pending", close_timeout_s=1.0)
    for step in range(1, 6):
        live.log(step, {"loss": 1.0 / step, "step": step, "note": "text is not a metric"})
    live.set_tags({"tidal.checkpoint_root_hash": "ab" * 32})
    assert live.close() == 6  # 5 rows and 1 tag undelivered, kept on disk
    assert len(list((tmp_path / "pending").glob("*-log_metrics-*.json"))) == 1
    assert Tracker(good, "replay", pending_dir=tmp_path / "pending").replay_pending() == 1
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(s, 1.0 / s) for s in range(1, 6)]
    assert client.get_run(run_id).data.tags["tidal.checkpoint_root_hash"] == "ab" * 32
