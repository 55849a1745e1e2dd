"""The ``eval`` step kind: lm-evaluation-harness tasks on a checkpoint of a train step -> ``results.json``.

Invariant: ``results.json`` is a pure function of the checkpoint, the tokenizer, the task definitions
(their hashes are in the step config, so editing a task gives a new step id) and lm-eval's version:
no timestamp, no wall time, no path in it, keys sorted, so two runs write the same bytes. Wall times
go to the step summary (``eval_seconds/<task>``), which the runner records in ``step.json`` and MLflow
(tidal/core/pipeline.py, through tidal/tracking: this module never talks to MLflow).

Nothing is downloaded: ``HF_DATASETS_OFFLINE`` and ``HF_HUB_OFFLINE`` are set, the task data are
the repository's JSONL files (:mod:`tidal.eval.suite`) and lm-eval's built-in task index is not read.
Each task runs in its own ``simple_evaluate`` call (its wall time is measured alone), zero-shot,
without bootstrap standard errors (``bootstrap_iters=0``) and with lm-eval's fixed seeds.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tidal.context import StepContext
from tidal.eval.config import EvalStepConfig, lm_eval_version
from tidal.eval.suite import task_hash, task_specs

STEP_VERSION = 1
RESULTS_JSON = "results.json"


def _metrics(task_result: dict[str, Any]) -> dict[str, float | None]:
    """lm-eval's ``results[task]`` -> ``{metric: value}`` (``acc,none`` -> ``acc``; non-finite -> None)."""
    out: dict[str, float | None] = {}
    for key, value in sorted(task_result.items()):
        if key == "alias" or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        name = key.removesuffix(",none")
        if name.endswith("_stderr") or name == "sample_len":
            continue  # bootstrap_iters=0: no standard errors; sample_len is n_examples
        out[name] = float(value) if math.isfinite(value) else None
    return out


def evaluate(model: Any, cfg: EvalStepConfig, cache_dir: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """Run every task of ``cfg`` on ``model`` (a :class:`tidal.train.trained.TrainedModel`).

    Returns:
        ``(results, seconds)``: the ``results.json`` content and each task's wall time in seconds.

    Raises:
        ValueError: a task's definition no longer has the hash the step config holds (edited after planning).
    """
    for name in cfg.tasks:  # before any work: the step id names the definitions it was planned with
        if task_hash(name) != cfg.task_hashes.get(name):
            raise ValueError(f"eval task {name}: its definition's hash {task_hash(name)} is not the "
                             f"{cfg.task_hashes.get(name)} this step was planned with; plan again")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from tidal.eval.lm import TidalLM

    lm = TidalLM(model, batch_size=cfg.batch_size, max_length=cfg.seq_len - 1)
    manager = TaskManager(include_defaults=False)
    version = lm_eval_version()
    tok_hash = str(model.tokenizer_meta.get("tokenizer_hash"))
    tasks: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for name in cfg.tasks:
        started = time.perf_counter()
        out = simple_evaluate(model=lm, tasks=task_specs([name], cache_dir), num_fewshot=cfg.num_fewshot,
                              task_manager=manager, bootstrap_iters=0, log_samples=False, cache_requests=False)
        seconds[name] = time.perf_counter() - started
        tasks[name] = {
            "metrics": _metrics(out["results"][name]),
            "n_examples": int(out["n-samples"][name]["effective"]),
            "n_shot": cfg.num_fewshot,
            "batch_size": cfg.batch_size,
            "task_hash": cfg.task_hashes[name],
            "tokenizer_hash": tok_hash,
            "checkpoint_root_hash": model.checkpoint_root_hash,
            "lm_eval_version": version,
        }
    results = {"train_step": model.step_id, "checkpoint_step": model.checkpoint_step,
               "checkpoint_root_hash": model.checkpoint_root_hash, "tokenizer_hash": tok_hash,
               "lm_eval_version": version, "batch_size": cfg.batch_size, "tasks": tasks}
    return results, seconds


def run(ctx: StepContext) -> dict[str, Any]:
    """Step entry point: evaluate a checkpoint of input ``train`` (``cfg.checkpoint_step``, None: its final
    one), write ``results.json``.

    Returns:
        The flat summary: ``<task>/<metric>`` values, ``eval_seconds/<task>``, ``checkpoint_root_hash``.
    """
    from tidal.train.trained import load_trained

    cfg: EvalStepConfig = ctx.config  # parsed once, at plan time
    # the tokenizer from this step's own input: on an object-store root the train step's recorded path is a URI
    model = load_trained(ctx.input_dir(cfg.train), cfg.checkpoint_step, tokenizer_dir=ctx.input_dir(cfg.tokenizer))
    with tempfile.TemporaryDirectory(prefix="tidal-eval-datasets-") as cache:
        results, seconds = evaluate(model, cfg, Path(cache))
    (ctx.out_dir / RESULTS_JSON).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    summary: dict[str, Any] = {"checkpoint_root_hash": model.checkpoint_root_hash}
    for name, entry in results["tasks"].items():
        summary.update({f"{name}/{m}": v for m, v in entry["metrics"].items() if v is not None})
        summary[f"eval_seconds/{name}"] = round(seconds[name], 3)
        ctx.log.info("eval %s: %s in %.2f s", name, entry["metrics"], seconds[name])
    return summary
