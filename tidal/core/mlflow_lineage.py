"""The MLflow 3 lineage objects of one recorded step, built from the storage root
(:class:`tidal.tracking.mlflow_lineage.Lineage`; :meth:`tidal.core.pipeline.Pipeline.record` hands them to the
tracker with the step's run).

Invariant: only metadata is read: each input step's ``step.json`` and ``manifest.json`` (root hash,
byte count), a train step's ``checkpoint_manifests/<n>.json`` and ``summary.json``; never a data file.
Whatever cannot be read is left out with a warning: lineage never fails a committed step.

* Any step kind: its input steps are its datasets (name = step name, source = the step's URI under the
  root, digest = its manifest root hash), with MLflow's context ``training`` for a train step,
  ``evaluation`` for an eval step, else ``input``.
* A train step: one logged model per permanent checkpoint (a step that is a multiple of
  ``checkpoint_permanent_every``) and for the final checkpoint (``summary.json``'s ``checkpoint_step``);
  the final one is registered as a version of the registered model named like the pipeline's
  experiment (``tidal-<recipe>``; a scaling suite's: ``tidal-<suite>``) with the tags ``licence`` (the training
  sources' licences, as the recipe declares them, joined with ``AND``) and ``intended_use``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tidal.quality.licences import licence_decisions
from tidal.steps import Step
from tidal.storage import Storage, StorageError
from tidal.storage.layout import MANIFEST_JSON, STEP_JSON, SUMMARY_JSON
from tidal.tracking.mlflow_lineage import CONTEXT_OF_KIND, CheckpointModel, Lineage, Registration, StepDataset
from tidal.train.mirror import CHECKPOINT_DIR, MANIFEST_DIR

log = logging.getLogger("tidal.tracking")
_READ_ERRORS = (OSError, StorageError, ValueError, KeyError, TypeError)


def _read_json(storage: Storage, step_id: str, name: str) -> dict[str, Any] | None:
    try:
        data = json.loads(storage.read_text(step_id, name))
    except _READ_ERRORS as err:
        log.warning("lineage: %s of %s not read (%s); left out", name, step_id, err)
        return None
    return data if isinstance(data, dict) else None


def input_datasets(step: Step, storage: Storage) -> list[StepDataset]:
    """The committed input steps of ``step`` (any kind) as metadata-only datasets, in input order.

    Reads each input's ``step.json`` (its manifest root hash) and ``manifest.json`` (``total_bytes``)
    and nothing else. An input that is not committed, or whose records cannot be read, is left out
    (with a warning).
    """
    found = []
    for dep in step.inputs:
        record = _read_json(storage, dep.step_id, STEP_JSON)
        root_hash = (record or {}).get("manifest_root_hash")
        if not isinstance(root_hash, str):
            continue
        manifest = _read_json(storage, dep.step_id, MANIFEST_JSON) or {}
        size = manifest.get("total_bytes")
        found.append(StepDataset(dep.name, dep.step_id, dep.kind, storage.step_uri(dep.step_id), root_hash,
                                 size if isinstance(size, int) else None))
    return found


def checkpoint_models(step: Step, storage: Storage, summary: dict[str, Any]) -> list[CheckpointModel]:
    """The checkpoints of committed train step ``step`` that get a logged model: every permanent one
    (a multiple of ``checkpoint_permanent_every``) whose manifest is in the step, and the final one
    (``summary["checkpoint_step"]``, with ``summary["params_sha256"]``), ascending by step.

    ``params_sha256`` of a permanent checkpoint is its manifest's ``params_sha256`` when recorded, else None.
    """
    every = step.config.get("checkpoint_permanent_every")
    final = summary.get("checkpoint_step")
    prefix = f"{step.step_id}/{MANIFEST_DIR}/"
    try:
        names = storage.list_rel(prefix)
    except _READ_ERRORS as err:
        log.warning("lineage: checkpoint manifests of %s not listed (%s)", step.step_id, err)
        return []
    models = []
    for rel in names:
        stem = rel[len(prefix):].removesuffix(".json")
        if not stem.isdigit():
            continue
        number = int(stem)
        is_final = number == final
        if not is_final and not (isinstance(every, int) and every > 0 and number % every == 0):
            continue
        manifest = _read_json(storage, step.step_id, f"{MANIFEST_DIR}/{stem}.json")
        if manifest is None or not isinstance(manifest.get("root_hash"), str):
            continue
        params = summary.get("params_sha256") if is_final else manifest.get("params_sha256")
        models.append(CheckpointModel(step.step_id, number, storage.object_uri(f"{step.step_id}/{CHECKPOINT_DIR}/"
                                                                               f"{number}"),
                                      manifest["root_hash"], params if isinstance(params, str) else None,
                                      final=is_final))
    return sorted(models, key=lambda m: m.checkpoint_step)


def registration(recipe: Any, model_name: str) -> Registration:
    """Where a recipe's final checkpoints are registered: registered model ``model_name`` (the pipeline's
    experiment name: ``tidal-<recipe>``, for a scaling suite ``tidal-<suite>``), with the tags
    ``licence`` (the training sources' normalized SPDX expressions, each in parentheses when it holds an
    ``OR``, joined with ``AND``: every one applies to the weights), ``intended_use`` (comma-separated)
    and ``tidal.licence.<source>`` per training source."""
    sources = {name: recipe.sources[name] for name in recipe.train_sources}
    decisions = licence_decisions(sources, recipe.licences)
    licences = sorted({d["licence"] for d in decisions.values()})
    joined = " AND ".join(f"({text})" if " OR " in text and len(licences) > 1 else text for text in licences)
    return Registration(model_name, joined, ",".join(recipe.intended_use),
                        {f"tidal.licence.{name}": d["licence"] for name, d in decisions.items()})


def step_lineage(step: Step, storage: Storage, recipe: Any, model_name: str,
                 summary: dict[str, Any] | None = None, committed: bool = True) -> Lineage:
    """The :class:`Lineage` a recorded step logs: its input datasets; for a committed ``train`` step
    also its :func:`checkpoint_models` (``summary``: its ``summary.json``, read from the step when it
    lacks ``checkpoint_step``) and the final one's :func:`registration` as ``model_name``.
    ``committed=False`` (a failed step): the input datasets only."""
    datasets = tuple(input_datasets(step, storage))
    context = CONTEXT_OF_KIND.get(step.kind, "input")
    if step.kind != "train" or not committed:
        return Lineage(datasets, context)
    if not summary or "checkpoint_step" not in summary:
        summary = _read_json(storage, step.step_id, SUMMARY_JSON) or {}
    models = tuple(checkpoint_models(step, storage, summary))
    registered = registration(recipe, model_name) if any(m.final for m in models) else None
    return Lineage(datasets, context, models, registered)


__all__ = ["checkpoint_models", "input_datasets", "registration", "step_lineage"]
