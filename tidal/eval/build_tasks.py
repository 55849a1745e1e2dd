"""Build the offline eval suite (``tidal/eval/tasks/``) from a recipe's committed clean steps.

``python -m tidal.eval.build_tasks --clean-brown DIR --clean-udhr DIR --seed 20261130 --fraction 0.02``
(``tools/eval_tasks/build.py`` runs or reuses the clean steps of a recipe and calls :func:`build`).
Same inputs, same bytes.

Invariant: every Brown item comes from a document of the recipe's in-distribution held-out split
(:func:`tidal.data.heldout.is_heldout` of the clean step's document id with the recipe seed and
fraction), which the tokenizer and the mixture never see; every UDHR item comes from the UDHR
source, which the recipe keeps out of the mixture. Each item records its ``doc_id`` so a test checks
it (tests/eval/test_tasks.py).

* ``tidal_brown_lastword`` (LAMBADA-style, Paperno et al. 2016): the text of a held-out document up to
  the last word of one of its sentences (at most ``CONTEXT_WORDS`` words back); the target is that word.
* ``tidal_brown_cloze``: the same passages as four-way multiple choice: the true last word and three
  distractors drawn (``random.Random(seed)``) from other items' last words.
* ``tidal_udhr_<lang>``: per-language perplexity (word/byte perplexity, bits per byte) over the
  paragraphs of UDHR in a few languages (``UDHR_LANGUAGES``).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tidal.data.eval_tasks import TASKS_DIR
from tidal.data.heldout import HeldoutSplit, is_heldout

CONTEXT_WORDS = 60
ITEMS_PER_DOCUMENT = 8
MAX_ITEMS = 96
UDHR_LANGUAGES = {"eng": "eng.html", "fra": "fra.html", "deu": "deu_1901.html", "rus": "rus.html",
                  "cmn": "cmn_hans.html"}
WORD = re.compile(r"^[A-Za-z]{3,}$")


def _documents(clean_dir: Path) -> list[dict]:
    rows = [r for f in sorted(clean_dir.glob("documents-*.parquet"))
            for r in pq.read_table(f, columns=["id", "text", "ref"]).to_pylist()]
    if not rows:
        raise SystemExit(f"error: {clean_dir}: no documents-*.parquet; give a committed clean step's directory")
    return sorted(rows, key=lambda r: r["id"])


def lastword_items(docs: list[dict], split: HeldoutSplit) -> list[dict]:
    """LAMBADA-style items from the held-out documents of ``docs`` (module docstring), in document id order.

    Returns:
        ``{"doc_id", "context", "target"}`` records; at most ``ITEMS_PER_DOCUMENT`` per document.
    """
    items: list[dict] = []
    for doc in docs:
        if not is_heldout(doc["id"], split):
            continue
        words = doc["text"].split()
        ends = [i for i, w in enumerate(words) if w in (".", "!", "?") and i >= CONTEXT_WORDS // 2]
        taken = 0
        for end in ends:
            target = words[end - 1]
            if not WORD.match(target) or taken >= ITEMS_PER_DOCUMENT:
                continue
            context = " ".join(words[max(0, end - 1 - CONTEXT_WORDS): end - 1])
            items.append({"doc_id": doc["id"], "context": context, "target": target})
            taken += 1
    return items[:MAX_ITEMS]


def cloze_items(lastword: list[dict], seed: int) -> list[dict]:
    """Four-way multiple choice over ``lastword`` items: the answer at a seeded position among three
    distractors (other items' targets, each different from the answer)."""
    rng = random.Random(seed)
    pool = sorted({it["target"] for it in lastword})
    if len({w.lower() for w in pool}) < 4:
        raise SystemExit(f"error: the held-out documents give {len(pool)} distinct last words; a four-way cloze "
                         "needs at least 4")
    out = []
    for it in lastword:
        others = [w for w in pool if w.lower() != it["target"].lower()]
        choices = rng.sample(others, 3)
        label = rng.randrange(4)
        choices.insert(label, it["target"])
        out.append({"doc_id": it["doc_id"], "context": it["context"], "choices": choices, "label": label})
    return out


def udhr_items(docs: list[dict]) -> dict[str, list[dict]]:
    """``{language: [{"doc_id", "text"}]}``: the non-empty paragraphs of each UDHR_LANGUAGES document."""
    by_ref = {d["ref"]: d for d in docs}
    out = {}
    for lang, ref in UDHR_LANGUAGES.items():
        if ref not in by_ref:
            raise SystemExit(f"error: clean-udhr has no document {ref!r} (language {lang})")
        doc = by_ref[ref]
        out[lang] = [{"doc_id": doc["id"], "text": p.strip()} for p in doc["text"].split("\n") if p.strip()]
    return out


_LOGLIKELIHOOD = """task: {task}
output_type: loglikelihood
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_target: " {{{{target}}}}"
metric_list:
  - {{metric: perplexity, aggregation: perplexity, higher_is_better: false}}
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
metadata: {{version: 1}}
"""
_MULTIPLE_CHOICE = """task: {task}
output_type: multiple_choice
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: " "
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
metadata: {{version: 1}}
"""
_ROLLING = """task: {task}
output_type: loglikelihood_rolling
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - {{metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}}
  - {{metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}}
  - {{metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}}
metadata: {{version: 1}}
"""


def _write(out: Path, task: str, template: str, items: list[dict]) -> None:
    data = f"{task}.jsonl"
    (out / data).write_text("".join(json.dumps(it, ensure_ascii=False, sort_keys=True) + "\n" for it in items))
    header = "# generated by python -m tidal.eval.build_tasks (tidal/eval/build_tasks.py); do not edit\n"
    (out / f"{task}.yaml").write_text(header + template.format(task=task, data=data))


def build(clean_brown: Path, clean_udhr: Path, split: HeldoutSplit, out: Path = TASKS_DIR) -> list[str]:
    """Write every task's YAML and JSONL under ``out``; returns the task names, sorted."""
    out.mkdir(parents=True, exist_ok=True)
    lastword = lastword_items(_documents(clean_brown), split)
    if not lastword:
        raise SystemExit(f"error: {clean_brown}: no held-out document gives a last-word item")
    _write(out, "tidal_brown_lastword", _LOGLIKELIHOOD, lastword)
    _write(out, "tidal_brown_cloze", _MULTIPLE_CHOICE, cloze_items(lastword, split.seed))
    names = ["tidal_brown_cloze", "tidal_brown_lastword"]
    for lang, items in udhr_items(_documents(clean_udhr)).items():
        _write(out, f"tidal_udhr_{lang}", _ROLLING, items)
        names.append(f"tidal_udhr_{lang}")
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clean-brown", type=Path, required=True)
    parser.add_argument("--clean-udhr", type=Path, required=True)
    parser.add_argument("--seed", type=int, required=True, help="the recipe seed (held-out split)")
    parser.add_argument("--fraction", type=float, required=True, help="evaluation.heldout.fraction")
    parser.add_argument("--out", type=Path, default=TASKS_DIR)
    args = parser.parse_args(argv)
    names = build(args.clean_brown, args.clean_udhr, HeldoutSplit(fraction=args.fraction, seed=args.seed), args.out)
    print("\n".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
