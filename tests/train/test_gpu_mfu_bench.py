"""bench/gpu_mfu.py runs end to end in its CPU smoke mode; bench/gpu_mfu.sh is valid bash."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_smoke_mode_trains_and_reports(capsys):
    sys.path.insert(0, str(REPO))
    from bench.gpu_mfu import main
    from tidal.train.flops import ModelConfig, flops_per_token, param_count

    result = main(["--smoke"])
    out = capsys.readouterr().out
    cfg = ModelConfig(preset="tiny").shape(512)
    assert result["params"] == param_count(cfg) and result["flops_per_token"] == flops_per_token(cfg, 64)
    assert result["tokens_per_s"] > 0 and result["step_s"] > 0 and result["planned_gib"] > 0
    assert math.isnan(result["mfu"])  # a CPU has no peak bf16 FLOP/s in the table
    assert out.strip().splitlines()[-1].startswith("RESULT mfu=nan tokens_per_s=")


def test_shell_script_parses():
    subprocess.run(["bash", "-n", str(REPO / "bench" / "gpu_mfu.sh")], check=True)
