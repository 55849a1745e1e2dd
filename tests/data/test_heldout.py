"""The in-distribution held-out split (tidal/data/heldout.py): the rule, the tokenize step packing
the held-out documents apart, the mixture and the tokenizer never seeing them, shard-count
independence, and the recipe field."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.data.builders import write_clean_step
from tests.data.test_tokenize import corpus
from tidal.config import RecipeError
from tidal.context import StepContext
from tidal.core.planner import build_graph
from tidal.data import mix as mix_step
from tidal.data import tokenize as tokenize_step
from tidal.data import tokenizer as tokenizer_step
from tidal.data.heldout import HeldoutSplit, is_heldout
from tidal.data.shards import load_token_sequences
from tidal.recipe import parse_recipe

SPLIT = {"fraction": 0.2, "seed": 11}
SEQ_LEN = 16


def train_tokenizer(root: Path, clean: Path, heldout: dict | None = None) -> Path:
    tok = root / "tokenizer"
    tok.mkdir(parents=True)
    config = {"mode": "train", "vocab_size": 350, "min_frequency": 2, "sources": ["clean-syn"],
              **({"heldout": heldout} if heldout else {})}
    tokenizer_step.run(StepContext("tokenizer-t", "tokenizer", "tokenizer", config, tok, {"clean-syn": clean}))
    return tok


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heldout")
    clean = write_clean_step(root / "clean-syn", corpus(), "syn", shards=2)
    return {"clean-syn": clean, "tokenizer": train_tokenizer(root, clean), "root": root}


def run_tokenize(clean: Path, tok: Path, out: Path, shards: int = 3, heldout: dict | None = SPLIT) -> dict:
    out.mkdir(parents=True)
    config = {"source": "syn", "input": "clean-syn", "tokenizer": "tokenizer", "seq_len": SEQ_LEN,
              "shards": shards, **({"heldout": heldout} if heldout else {})}
    ctx = StepContext("tokenize-syn-t", "tokenize-syn", "tokenize", config, out, {"clean-syn": clean, "tokenizer": tok})
    summary = tokenize_step.run(ctx)
    tokenize_step.check_outputs(ctx.config, out)  # the step's TokenizeConfig, as the commit hands it over
    assert sorted(tokenize_step.expected_outputs(ctx.config)) == sorted(p.name for p in out.iterdir())
    return summary


def documents(clean: Path) -> list[tuple[str, str]]:
    table = pa.concat_tables(pq.read_table(p) for p in sorted(clean.glob("documents-*.parquet")))
    return sorted(zip(table.column("id").to_pylist(), table.column("text").to_pylist()))


def packed(tok: Path, docs: list[tuple[str, str]]) -> np.ndarray:
    """The rows a tokenize step must write for ``docs``: id order, one eos each, the tail dropped."""
    tokenizer, meta = tokenizer_step.load(tok)
    stream = [t for _, text in docs for t in tokenizer.encode(text, add_special_tokens=False).ids + [meta["eos_id"]]]
    n = len(stream) // SEQ_LEN
    return np.array(stream[: n * SEQ_LEN]).reshape(n, SEQ_LEN)


def heldout_rows(out: Path) -> np.ndarray:
    return np.load(out / tokenize_step.HELDOUT_TOKENS)


def test_rule_by_hand_and_rate():
    split = HeldoutSplit(**SPLIT)
    ids = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(20000)]
    chosen = [i for i in ids if is_heldout(i, split)]
    by_hand = [i for i in ids if int(hashlib.sha256(f"11:{i}".encode()).hexdigest()[:16], 16) < 0.2 * 2**64]
    assert chosen == by_hand
    assert abs(len(chosen) - 4000) < 4 * (20000 * 0.2 * 0.8) ** 0.5  # binomial, 4 standard deviations
    other_seed = {i for i in ids if is_heldout(i, HeldoutSplit(fraction=0.2, seed=12))}
    assert other_seed != set(chosen) and abs(len(other_seed & set(chosen)) - 800) < 200  # independent draws


def test_tokenize_packs_heldout_documents_apart(steps):
    out = steps["root"] / "tokenize-split"
    summary = run_tokenize(steps["clean-syn"], steps["tokenizer"], out)
    docs = documents(steps["clean-syn"])
    held = [d for d in docs if is_heldout(d[0], HeldoutSplit(**SPLIT))]
    kept = [d for d in docs if not is_heldout(d[0], HeldoutSplit(**SPLIT))]
    assert 0 < len(held) < len(docs) // 3
    assert json.loads((out / tokenize_step.HELDOUT_DOCUMENTS).read_text()) == [i for i, _ in held]
    # the training shards are exactly the packing of the documents that are not held out ...
    assert np.array_equal(load_token_sequences(out), packed(steps["tokenizer"], kept))
    # ... and the held-out shard that of the held-out ones, by the same rules
    assert np.array_equal(heldout_rows(out), packed(steps["tokenizer"], held))
    meta = json.loads((out / "meta.json").read_text())
    held_meta = json.loads((out / tokenize_step.HELDOUT_META).read_text())
    assert meta["n_documents"] == len(kept) and held_meta["n_documents"] == summary["heldout_documents"] == len(held)
    assert held_meta["heldout"] == SPLIT and held_meta["tokenizer_hash"] == meta["tokenizer_hash"]
    assert meta["heldout_sequences"] == held_meta["n_sequences"] == heldout_rows(out).shape[0]


def test_mixture_never_holds_heldout_documents(steps):
    out = steps["root"] / "tokenize-mixed"
    run_tokenize(steps["clean-syn"], steps["tokenizer"], out)
    mixed = steps["root"] / "mix"
    mixed.mkdir()
    mix_step.run(StepContext("mix-t", "mix", "mix", {"weights": {"syn": 1.0}, "inputs": {"syn": "tokenize-syn"},
                                                      "shards": 2}, mixed, {"tokenize-syn": out}, seed=5))
    mixture = load_token_sequences(mixed)
    kept = [d for d in documents(steps["clean-syn"]) if not is_heldout(d[0], HeldoutSplit(**SPLIT))]
    training = sorted(row.tobytes() for row in packed(steps["tokenizer"], kept).astype(mixture.dtype))
    # the mixture's sequences are, as a multiset, the sequences of the non-held-out documents' stream
    # (the default mixture takes every one), so no held-out document id reaches training
    assert sorted(row.tobytes() for row in mixture) == training


def test_split_is_independent_of_shard_counts(steps, tmp_path):
    texts = corpus()
    outs = []
    for clean_shards, token_shards in ((1, 1), (3, 2), (2, 5)):
        clean = write_clean_step(tmp_path / f"clean-{clean_shards}", texts, "syn", shards=clean_shards)
        out = tmp_path / f"tokenize-{clean_shards}-{token_shards}"
        run_tokenize(clean, steps["tokenizer"], out, shards=token_shards)
        outs.append(out)
    first = outs[0]
    for out in outs[1:]:
        for name in (tokenize_step.HELDOUT_DOCUMENTS, tokenize_step.HELDOUT_TOKENS, tokenize_step.HELDOUT_META):
            assert (out / name).read_bytes() == (first / name).read_bytes(), name
        assert np.array_equal(load_token_sequences(out), load_token_sequences(first))


def test_tokenizer_never_trains_on_heldout_documents(steps, tmp_path):
    with_split = train_tokenizer(tmp_path / "a", steps["clean-syn"], SPLIT)
    kept = [text for doc_id, text in documents(steps["clean-syn"]) if not is_heldout(doc_id, HeldoutSplit(**SPLIT))]
    without = train_tokenizer(tmp_path / "b", write_clean_step(tmp_path / "kept", kept, "syn"))
    assert (with_split / "tokenizer.json").read_bytes() == (without / "tokenizer.json").read_bytes()


def test_a_split_too_small_for_one_sequence_fails_the_step(steps, tmp_path):
    clean = write_clean_step(tmp_path / "clean-small", corpus()[:40], "syn")
    with pytest.raises(ValueError, match=r"source syn: evaluation.heldout.fraction 0.001 holds out 0 documents"):
        run_tokenize(clean, steps["tokenizer"], tmp_path / "out", heldout={"fraction": 0.001, "seed": 11})


def test_recipe_plans_the_split(tiny_data):
    graph = build_graph(parse_recipe(tiny_data))
    split = {"fraction": tiny_data["evaluation"]["heldout"]["fraction"], "seed": tiny_data["seed"]}
    assert graph["tokenizer"].config["heldout"] == split
    for src in ("brown", "gcide", "songci"):
        assert graph[f"tokenize-{src}"].config["heldout"] == split
    assert "heldout" not in graph["tokenize-udhr"].config  # a whole eval source: nothing to split
    train = graph["train"]
    assert train.config["heldout_data"] == {s: f"tokenize-{s}" for s in ("brown", "gcide", "songci")}
    assert train.config["eval_data"] == {"udhr": "tokenize-udhr"}
    assert {"tokenize-brown", "tokenize-gcide", "tokenize-songci", "tokenize-udhr"} <= {s.name for s in train.inputs}
    without = build_graph(parse_recipe({**tiny_data, "evaluation": {"sources": ["udhr"]}}))
    assert "heldout" not in without["tokenize-brown"].config and "heldout_data" not in without["train"].config


@pytest.mark.parametrize(("evaluation", "message"), [
    ({"heldout": {"fraction": 0}}, "evaluation.heldout.fraction"),
    ({"heldout": {"fraction": 0.9}}, "evaluation.heldout.fraction"),
    ({"sources": []}, "evaluation needs `sources`"),
])
def test_bad_evaluation_is_one_error_naming_the_field(tiny_data, evaluation, message):
    with pytest.raises(RecipeError, match=message) as info:
        parse_recipe({**tiny_data, "evaluation": evaluation}, path="recipes/x.yaml")
    assert str(info.value).startswith("recipes/x.yaml: ")
