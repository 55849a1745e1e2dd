"""The decontaminate step: exact 13-gram containment of eval text, on a fixture whose paragraphs hold known
shares of the eval n-grams, through the real step (pyarrow shards in, shards + removed + counts out)."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tidal.context import StepContext
from tidal.data import decontaminate as decon
from tidal.data.decontaminate_config import DecontaminateConfig
from tidal.data.shards import DOCUMENT_SCHEMA

N = 13
EVAL = [f"evalword{i}" for i in range(200)]  # one eval document of 200 distinct words: 188 13-grams
# paragraph name -> (k, m): the first k + 12 eval words, then m fresh words: k of its k + m 13-grams are
# in the index (a window reaching a fresh word is not), a share of exactly k / (k + m)
SHARES = {"s0": (0, 20), "s25": (5, 15), "s50": (10, 10), "s80": (16, 4), "s84": (21, 4), "s85": (17, 3),
          "s100": (20, 0)}
SHORT = ["...", "A.", "##", " ".join(EVAL[:12])]  # fewer than 13 words: never contaminated
CONTAMINATED = {0.0: {"s25", "s50", "s80", "s84", "s85", "s100"}, 0.5: {"s50", "s80", "s84", "s85", "s100"},
                0.85: {"s85", "s100"}, 1.0: {"s100"}}


def paragraph(name: str) -> str:
    k, m = SHARES[name]
    words = EVAL[: k + N - 1] if k else []
    return " ".join([*words, *(f"{name}fresh{j}" for j in range(m + (0 if k else N - 1)))])


def documents() -> list[dict]:
    """One document per share paragraph (it, then a clean paragraph of its own), one of the short
    paragraphs only, and one clean document; ids are sha256 of the text, as the clean step's."""
    own = "which nobody evaluates, written in plain words here."
    texts = [f"{paragraph(name)}\n\nA clean paragraph of the document {name}, {own}" for name in SHARES]
    texts += ["\n".join(SHORT), "Nothing of the eval set here; only ordinary words of a training document."]
    rows = [{"id": hashlib.sha256(t.encode()).hexdigest(), "text": t, "source": "train", "ref": f"r{i:02d}",
             "language": "en", "fields": json.dumps({"n": i})} for i, t in enumerate(texts)]
    return sorted(rows, key=lambda r: r["id"])


def write_step(path, rows: list[dict], shards: int = 1) -> None:
    path.mkdir(parents=True)
    for k in range(shards):
        part = [r for r in rows if int(r["id"], 16) % shards == k]
        pq.write_table(pa.Table.from_pylist(part, schema=DOCUMENT_SCHEMA),
                       path / f"documents-{k:05d}-of-{shards:05d}.parquet")


def run_step(tmp_path, threshold: float, remove: str = "paragraph", shards: int = 1, name: str = "out"):
    base = tmp_path / name
    write_step(base / "clean-train", documents(), shards)
    write_step(base / "clean-eval", [{"id": "e" * 64, "text": " ".join(EVAL), "source": "ev", "ref": "e",
                                      "language": "en", "fields": None}])
    config = {"source": "train", "input": "clean-train", "n": N, "threshold": threshold, "remove": remove,
              "eval": {"ev": "clean-eval"}}
    out = base / "decontaminate-train"
    out.mkdir()
    ctx = StepContext("d-t", "decontaminate-train", "decontaminate", config, out,
                      {"clean-train": base / "clean-train", "clean-eval": base / "clean-eval"})
    summary = decon.run(ctx)
    decon.check_outputs(config, out)
    return out, summary


def test_shares_are_exact():
    index = decon.Index({"ev": decon.build_index([" ".join(EVAL)], N)})
    assert index.sizes() == {"ev": 200 - N + 1}
    paras, marked = decon.mark([paragraph(n) for n in SHARES], index, N, 0.0)
    shares = {name: (m[0][2] if m else 0.0) for name, m in zip(SHARES, marked, strict=True)}
    assert shares == {name: k / (k + m) for name, (k, m) in SHARES.items()}
    assert all(len(ws) == sum(SHARES[n]) + N - 1 for n, ((_, ws),) in zip(SHARES, paras, strict=True))


@pytest.mark.parametrize("threshold", sorted(CONTAMINATED))
def test_thresholds_remove_exactly_the_paragraphs_at_or_above(tmp_path, threshold):
    out, summary = run_step(tmp_path, threshold)
    removed = pq.read_table(out / decon.REMOVED_FILE).to_pylist()
    assert {r["outcome"] for r in removed} == {"paragraph"}
    assert all(r["reason"] == "contaminated" and r["eval_source"] == "ev" for r in removed)
    kept = pq.read_table(out / "documents-00000-of-00001.parquet")
    assert kept.schema == DOCUMENT_SCHEMA
    kept_lines = {line for text in kept.column("text").to_pylist() for line in text.split("\n")}
    gone = set(SHARES) - {n for n in SHARES if paragraph(n) in kept_lines}
    assert gone == CONTAMINATED[threshold]
    assert sorted(r["share"] for r in removed) == sorted(
        SHARES[n][0] / sum(SHARES[n]) for n in CONTAMINATED[threshold])
    for short in SHORT:  # "...", "A.", "##" and 12 eval words are never contaminated
        assert short in kept_lines
    counts = json.loads((out / decon.COUNTS_FILE).read_text())
    assert counts["paragraphs_contaminated"] == counts["paragraphs_removed"] == len(CONTAMINATED[threshold])
    assert counts["by_eval_source"] == {"ev": len(CONTAMINATED[threshold])}
    assert counts["in"] == counts["kept"] == len(documents()) and counts["documents_removed"] == 0
    assert counts["paragraphs"] == 2 * len(SHARES) + len(SHORT) + 1
    assert counts["paragraphs_checked"] == 2 * len(SHARES) + 1  # the short ones have no 13-gram
    assert summary["contaminated_ev"] == len(CONTAMINATED[threshold])
    # a cut document keeps its id, ref and fields, and its clean paragraph
    by_ref = {r["ref"]: r for r in kept.to_pylist()}
    originals = {r["ref"]: r for r in documents()}
    for ref, row in by_ref.items():
        assert (row["id"], row["fields"]) == (originals[ref]["id"], originals[ref]["fields"])
        if "clean paragraph" in originals[ref]["text"]:
            assert row["text"].endswith("written in plain words here.")


def test_remove_document_drops_whole_documents(tmp_path):
    out, _ = run_step(tmp_path, 0.5, remove="document")
    removed = pq.read_table(out / decon.REMOVED_FILE).to_pylist()
    assert [r["outcome"] for r in removed] == ["document"] * len(CONTAMINATED[0.5])
    counts = json.loads((out / decon.COUNTS_FILE).read_text())
    assert counts["documents_removed"] == len(CONTAMINATED[0.5]) == counts["in"] - counts["kept"]
    kept = pq.read_table(out / "documents-00000-of-00001.parquet").column("text").to_pylist()
    assert sorted(kept) == sorted(r["text"] for r in documents()
                                  if not any(paragraph(n) in r["text"].split("\n") for n in CONTAMINATED[0.5]))


def test_a_document_of_contaminated_paragraphs_only_is_removed(tmp_path):
    base = tmp_path
    text = f"{paragraph('s100')}\n\n{paragraph('s85')}"
    write_step(base / "clean-train", [{"id": "a" * 64, "text": text, "source": "t", "ref": "x", "language": "en",
                                       "fields": None}])
    write_step(base / "clean-eval", [{"id": "e" * 64, "text": " ".join(EVAL), "source": "ev", "ref": "e",
                                      "language": "en", "fields": None}])
    config = {"source": "t", "input": "clean-train", "threshold": 0.5, "eval": {"ev": "clean-eval"}}
    out = base / "out"
    out.mkdir()
    decon.run(StepContext("d", "d", "decontaminate", config, out,
                          {"clean-train": base / "clean-train", "clean-eval": base / "clean-eval"}))
    decon.check_outputs(config, out)
    outcomes = pq.read_table(out / decon.REMOVED_FILE).column("outcome").to_pylist()
    assert sorted(outcomes) == ["document", "paragraph", "paragraph"]
    assert pq.read_metadata(out / "documents-00000-of-00001.parquet").num_rows == 0


def test_same_bytes_twice_and_same_documents_whatever_the_shard_count(tmp_path):
    one, _ = run_step(tmp_path, 0.5, name="a")
    again, _ = run_step(tmp_path, 0.5, name="b")
    two, _ = run_step(tmp_path, 0.5, shards=2, name="c")
    for name in ("documents-00000-of-00001.parquet", decon.REMOVED_FILE, decon.COUNTS_FILE):
        assert (one / name).read_bytes() == (again / name).read_bytes()
    assert (one / decon.REMOVED_FILE).read_bytes() == (two / decon.REMOVED_FILE).read_bytes()
    assert (one / decon.COUNTS_FILE).read_bytes() == (two / decon.COUNTS_FILE).read_bytes()
    whole = pq.read_table(one / "documents-00000-of-00001.parquet").to_pylist()
    parts = [r for k in range(2) for r in pq.read_table(two / f"documents-{k:05d}-of-00002.parquet").to_pylist()]
    assert sorted(parts, key=lambda r: r["id"]) == whole


def test_config_defaults_are_gpt3s_13_grams():
    cfg = DecontaminateConfig(source="s", input="clean-s", eval={"u": "clean-u"})
    assert (cfg.n, cfg.remove) == (13, "paragraph")
    with pytest.raises(ValueError, match="threshold"):
        DecontaminateConfig(source="s", input="clean-s", eval={"u": "clean-u"}, threshold=1.5)
