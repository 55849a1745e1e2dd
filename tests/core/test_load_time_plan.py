"""Planning a load-time mixture (``mixture.load_time``): the train step reads the tokenize steps in place,
a weight change re-plans only the mix step and what follows it, and a recipe without it keeps its ids."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tidal.config import RecipeError
from tidal.core.planner import build_graph
from tidal.recipe import load_recipe

TINY = REPO / "recipes" / "tiny.yaml"
BUDGET = {"mode": "token_budget", "tokens": 2_000_000, "max_epochs": 4.0}


def plan(**overrides):
    return {s.name: s for s in build_graph(load_recipe(TINY, overrides))}


def test_the_train_step_reads_every_training_source_in_place():
    steps = plan(**{"mixture.load_time": True})
    assert {f"tokenize-{s}" for s in ("brown", "gcide", "songci")} <= {i.name for i in steps["train"].inputs}
    assert steps["mix"].config["load_time"] is True
    assert "load_time" not in plan()["mix"].config  # a copied mixture's config (and id) as before


def test_a_reweight_replans_the_mix_and_what_reads_it_only():
    before = plan(**{"mixture.load_time": True})
    after = plan(**{"mixture.load_time": True, "mixture.weights": {"brown": 0.6, "gcide": 0.2, "songci": 0.2}})
    changed = sorted(name for name in before if before[name].step_id != after[name].step_id)
    assert "mix" in changed and not any(name.startswith(("tokenize", "clean", "fetch")) for name in changed)


def test_stages_ending_at_a_step_hash_the_batch_size():
    stages = [{"weights": {"brown": 1}, "until_step": 100}, {"weights": {"brown": 1, "songci": 1}}]
    one = plan(**{"mixture.load_time": True, "mixture.size": BUDGET, "mixture.stages": stages})
    two = plan(**{"mixture.load_time": True, "mixture.size": BUDGET, "mixture.stages": stages,
                  "train.batch_size": 32})
    assert one["mix"].config["batch_size"] == 16 and two["mix"].config["batch_size"] == 32
    assert one["mix"].step_id != two["mix"].step_id
    # the gate holds the realized weights to the stages' overall ones: 100 of 2e6 / 128 / 16 steps in stage 1
    share = 100 * 16 / -(-2_000_000 // 128)
    assert one["gate"].config["weights"]["brown"] == pytest.approx(share + (1 - share) / 2, abs=1e-9)


def test_a_stage_naming_an_unknown_source_is_one_error_naming_the_field():
    with pytest.raises(RecipeError, match=r"mixture\.stages\.0\.weights.*sources \['web'\] are not in"):
        load_recipe(TINY, {"mixture.load_time": True, "mixture.size": BUDGET,
                           "mixture.stages": [{"weights": {"web": 1}, "until_fraction": 0.5},
                                              {"weights": {"brown": 1}}]})
