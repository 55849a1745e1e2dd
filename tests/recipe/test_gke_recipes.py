"""The realistic recipes of recipes/gke/ (issue 40, item 6): each plans offline (the pinned corpora stand in
for the data), fits its accelerator by the sizing `tidal plan` and a GKE launch use on a machine without
libtpu, and predicts an MFU in its band; their pods and JobSets are admitted by the API server
(tests/deploy/test_kube_server.py). Compiled sizings of the same recipes are bench/aot_sizing.py's."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tidal.cli import main
from tidal.core.load import load_pipeline
from tidal.train.flops import param_count
from tidal.train.preflight import preflight

RECIPES = REPO / "recipes" / "gke"
# recipe -> (parameters, chips, the analytical roofline's MFU band); the names say the size and the slice.
# Every recipe recomputes activations (remat), so the chips compute 4/3 of the model's FLOPs: MFU < 75 %.
EXPECTED = {
    "gke_150m_v5e8": ((1.2e8, 1.6e8), 8, (0.55, 0.75)),
    "gke_1b_v5e64": ((1.0e9, 1.2e9), 64, (0.55, 0.75)),
    "gke_1b_h100x8": ((1.0e9, 1.2e9), 8, (0.55, 0.75)),
    "gke_8b_v5p128": ((7.0e9, 8.1e9), 64, (0.55, 0.75)),
    "gke_8b_v6e256": ((7.0e9, 8.1e9), 256, (0.35, 0.75)),  # 256 chips: the gathers are a third of the step
}


def test_every_realistic_recipe_is_checked_here():
    assert sorted(p.stem for p in RECIPES.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_realistic_recipe_plans_offline_fits_and_predicts_its_mfu(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TIDAL_LIBTPU_DIR", str(tmp_path / "no-libtpu"))  # the analytical sizing, on any machine
    monkeypatch.setenv("TIDAL_SIZING_CACHE", str(tmp_path / "sizing"))
    path = RECIPES / f"{name}.yaml"
    assert main(["plan", str(path), "--storage-root", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert f"recipe {name} v1" in out and "sizing (tidal size):" in out and "fits" in out, out
    pipe = load_pipeline(path, storage_root=str(tmp_path / "store"))
    train = pipe.graph["train"]
    (low, high), chips, (mfu_low, mfu_high) = EXPECTED[name]
    assert low < param_count(train.typed_config.model.shape(pipe.recipe.tokenizer.vocab_size)) < high
    sizing = preflight(train, pipe.recipe)  # what the GKE launch checks before booking the chips
    assert sizing is not None and sizing.fits and sizing.chips == chips, sizing.describe()
    assert sizing.total_bytes < 0.9 * sizing.chip.hbm_bytes
    assert mfu_low < sizing.predicted["mfu"] < mfu_high, sizing.describe()
    assert sizing.flops_per_chip == pytest.approx(4 / 3 * sizing.model_flops_per_chip)  # the forward, twice
