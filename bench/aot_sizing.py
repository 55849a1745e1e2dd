"""Ahead-of-time sizing (issue 40, item 8): compile tidal's train step for TPU slices on this CPU and compare the
compiled HBM with the analytical estimate of tidal/train/memory.py.

Cells: presets (a MoE model among them) x slices, each compiled by the sizer (tidal/train/sizing.py, its own
process with libtpu), plus cells built to exceed one chip's HBM (refused) and their fixes (fit), and the two
large predictions the issue names: recipes/gke/gke_1b_v5e64.yaml (the 1b preset on v5e-64) and
recipes/gke/gke_8b_v6e256.yaml (Llama 3 8B's shape on v6e-256).

    .venv/bin/python bench/aot_sizing.py            # every cell (about an hour on 2 cores; the 8B compile is most)
    .venv/bin/python bench/aot_sizing.py --quick    # the calibration matrix and the refusals only

Prints one line per cell and then
``RESULT cells=… compile_s_median=… estimator_error_max=… refusals_correct=k/n predicted_mfu_1b_v5e64=…
predicted_mfu_8b_v6e256=…``. ``estimator_error_max`` is the largest |analytical - compiled| / compiled peak
bytes per chip over the calibration cells. Compiles are cached (TIDAL_SIZING_CACHE; the bench uses its own
folder unless that is set), so a rerun prints the figures in seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from tidal.launch.config import AcceleratorConfig
from tidal.train.config import TrainConfig
from tidal.train.sizing import libtpu_installed, request, size_step

VOCAB, SEQ = 32_000, 2048
MOE = {"d_model": 512, "n_layers": 4, "n_heads": 8, "d_ff": 1024, "moe": {"n_experts": 8, "top_k": 2}}
# (label, model, batch, chip, topology): the calibration matrix, 12 cells
CALIBRATION = [(f"{name}/{chip}-{topo}", model, batch, chip, topo)
               for name, model, batch in (("small", {"preset": "small"}, 32), ("125m", {"preset": "125m"}, 16),
                                          ("350m", {"preset": "350m"}, 8), ("moe", MOE, 16))
               for chip, topo in (("v5e", "2x2"), ("v5e", "2x4"), ("v6e", "2x2"))]
# built to exceed one chip (refused) and the same with what the refusal says to change (fits)
# (sized after a first run: at sequences of 2,048, 350m with 256 sequences needs 2 TB on one v5e chip and
# still 134 GiB in 16 microbatches; 125m holds 4 sequences at once in about 14 GiB on one chip)
REFUSALS = [("125m-b64/v5e-1x1", {"preset": "125m"}, 64, "v5e", "1x1", 1, False),
            ("125m-b64-mb16/v5e-1x1", {"preset": "125m"}, 64, "v5e", "1x1", 16, True),
            ("760m-b16/v5e-1x1", {"preset": "760m"}, 16, "v5e", "1x1", 1, False),
            ("760m-b16/v5e-2x4", {"preset": "760m"}, 16, "v5e", "2x4", 1, True)]
# the realistic recipes of recipes/gke/ (their own model, batch, microbatches and slice)
RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "gke"
LARGE = [("1b/v5e-8x8", "gke_1b_v5e64"), ("8b/v6e-16x16", "gke_8b_v6e256")]


def size(label: str, model: dict, batch: int, chip: str, topo: str, microbatches: int = 1):
    train = TrainConfig(model=model, batch_size=batch, steps=1000, microbatches=microbatches)
    acc = AcceleratorConfig(kind="tpu", type=chip, topology=topo)
    req = request(train, VOCAB, SEQ - 1, acc)
    sizing = size_step(label, req, train.model.shape(VOCAB), progress=lambda line: print(line, flush=True))
    mfu = sizing.predicted["mfu"] if sizing.compiled else float("nan")
    print(f"{label:<24} fits={sizing.fits!s:<5} compiled={sizing.total_bytes / 2**30:7.2f} GiB "
          f"analytical={sizing.estimate_bytes / 2**30:7.2f} GiB compile_s={sizing.compile_s} "
          f"predicted_mfu={mfu:.3f}", flush=True)
    return sizing


def size_recipe(label: str, name: str):
    """Size the train step of ``recipes/gke/{name}.yaml`` as ``tidal size`` does."""
    from tidal.recipe import load_recipe

    recipe = load_recipe(RECIPES / f"{name}.yaml")
    vocab, train = recipe.tokenizer.vocab_size, recipe.train
    req = request(train, vocab, recipe.tokenize.seq_len - 1, train.resources.accelerator)
    sizing = size_step(label, req, train.model.shape(vocab), progress=lambda line: print(line, flush=True))
    mfu = sizing.predicted["mfu"] if sizing.refusal is None else float("nan")
    print(f"{label:<24} recipe={name} fits={sizing.fits!s:<5} {sizing.method}={sizing.total_bytes / 2**30:7.2f} GiB "
          f"compile_s={sizing.compile_s} predicted_mfu={mfu:.3f}", flush=True)
    return sizing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the calibration matrix and the refusals only")
    args = parser.parse_args()
    if not libtpu_installed():
        print("error: libtpu is not installed (make tpu-tools)", file=sys.stderr)
        return 1
    os.environ.setdefault("TIDAL_SIZING_CACHE", str(Path(tempfile.gettempdir()) / "tidal-bench-sizing"))
    errors, compile_s = [], []
    for cell in CALIBRATION:
        sizing = size(*cell)
        if sizing.compiled:  # the analytical plan size_step computed beside the compile
            errors.append(abs(sizing.estimate_bytes - sizing.total_bytes) / sizing.total_bytes)
            compile_s.append(sizing.compile_s)
    correct = 0
    for label, model, batch, chip, topo, micro, should_fit in REFUSALS:
        sizing = size(label, model, batch, chip, topo, micro)
        correct += sizing.fits == should_fit
    mfu = {}
    for label, name in [] if args.quick else LARGE:
        sizing = size_recipe(label, name)
        mfu[label] = sizing.predicted["mfu"] if sizing.compiled else float("nan")
    print(f"RESULT cells={len(CALIBRATION)} compile_s_median={statistics.median(compile_s):.1f} "
          f"estimator_error_max={max(errors):.3f} refusals_correct={correct}/{len(REFUSALS)} "
          f"predicted_mfu_1b_v5e64={mfu.get('1b/v5e-8x8', float('nan')):.3f} "
          f"predicted_mfu_8b_v6e256={mfu.get('8b/v6e-16x16', float('nan')):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
