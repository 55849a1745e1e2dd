"""``train.continue_from``: the committed train step a continued run starts from, read from the root.

Invariant: a continued train step's id depends on what it starts from, not on where that lies. The
planner turns the user's reference (a step id under the storage root and ``checkpoint: final`` or a
step number) into two hashed things: an input step (:class:`tidal.steps.CommittedStep`, whose id is
derived from the hash input its ``step.json`` recorded) and, in the step config, the checkpoint's
step, the root hash of that checkpoint's manifest and the parent's step seed (the batch order that
continues). No path enters either: the parent is named by its id, and a step reads it at its
location under the root (:func:`tidal.core.commit.input_location`).

A reference that cannot be continued (no such committed step, not a train step, a checkpoint it did
not keep, another model or batch size, ``steps`` not above the checkpoint's) is one
:class:`tidal.config.RecipeError` naming ``train.continue_from``.
"""

from __future__ import annotations

import json
from typing import Any

from tidal.config import RecipeError
from tidal.steps import CommittedStep, derive_seed
from tidal.storage import Storage
from tidal.storage.layout import STEP_JSON
from tidal.train import CHECKPOINT_MANIFEST
from tidal.train.config import CONTINUE_INPUT, ContinueFrom, TrainConfig, continuation_problem

__all__ = ["committed_step", "resolve_continuation"]

FIELD = "train.continue_from"
MANIFEST_DIR = "checkpoint_manifests"  # tidal.train.mirror.MANIFEST_DIR (no JAX import here)


def committed_step(storage: Storage, step_id: str, name: str, where: str) -> CommittedStep:
    """The committed step ``step_id`` as an input named ``name``, from its ``step.json``.

    Raises:
        RecipeError: ``{where}: train.continue_from.step: ...`` when it is not committed under the root,
            its ``step.json`` is unreadable, or its recorded hash input does not give back ``step_id``.
    """
    if not storage.is_committed(step_id):
        raise RecipeError(f"{where}: {FIELD}.step: {step_id} is not a committed step under {storage.uri}; rule: "
                          "a run continues a committed train step of this storage root (the id `tidal plan` or "
                          "`tidal report` printed for it, e.g. train-1a2b3c4d5e6f)")
    try:
        record = json.loads(storage.read_text(step_id, STEP_JSON))
        recorded = record["hash_input"]
        step = CommittedStep(name=name, kind=recorded["kind"], config=recorded["config"], recorded=recorded)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RecipeError(f"{where}: {FIELD}.step: {step_id}: its {STEP_JSON} is unreadable "
                          f"({type(err).__name__}: {err})") from None
    if step.step_id != step_id:
        raise RecipeError(f"{where}: {FIELD}.step: {step_id}: its {STEP_JSON} hash input gives id {step.step_id}; "
                          "rule: a step's id is the hash of what it recorded (the file was edited)")
    return step


def _checkpoint(storage: Storage, parent: CommittedStep, ref: ContinueFrom, where: str) -> dict[str, Any]:
    """The manifest of the parent's checkpoint ``ref.checkpoint`` (its final one, or a kept one)."""
    name = CHECKPOINT_MANIFEST if ref.checkpoint == "final" else f"{MANIFEST_DIR}/{ref.checkpoint}.json"
    try:
        manifest = json.loads(storage.read_text(parent.step_id, name))
        int(manifest["step"]), str(manifest["root_hash"])
    except FileNotFoundError:
        kept = sorted(int(p.rsplit("/", 1)[-1][:-5]) for p in storage.list_rel(f"{parent.step_id}/{MANIFEST_DIR}/")
                      if p.endswith(".json") and p.rsplit("/", 1)[-1][:-5].isdigit())
        raise RecipeError(f"{where}: {FIELD}.checkpoint: {parent.step_id} kept no checkpoint {ref.checkpoint} "
                          f"(kept: {kept or 'none'}); rule: continue its final checkpoint or one it kept") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RecipeError(f"{where}: {FIELD}.checkpoint: {parent.step_id}/{name} is unreadable "
                          f"({type(err).__name__}: {err})") from None
    return manifest


def resolve_continuation(train: TrainConfig, storage: Storage, where: str) -> tuple[CommittedStep, dict[str, Any]]:
    """The parent input step and the resolved ``continue_from`` config of a recipe's ``train`` section.

    Returns:
        ``(parent, config)``: the :class:`CommittedStep` named :data:`CONTINUE_INPUT`, and the
        ``continue_from`` mapping of the step config (:class:`tidal.train.config.ResolvedContinue`).

    Raises:
        RecipeError: one line naming ``train.continue_from`` (module docstring).
    """
    ref = train.continue_from
    assert ref is not None
    parent = committed_step(storage, ref.step, CONTINUE_INPUT, where)
    if parent.kind != "train":
        raise RecipeError(f"{where}: {FIELD}.step: {ref.step} is a {parent.kind} step; rule: a run continues "
                          "a train step")
    config = parent.config
    mine = train.model.model_dump()
    if config.get("model") != mine:
        diff = sorted(k for k in set(mine) | set(config.get("model") or {})
                      if mine.get(k) != (config.get("model") or {}).get(k))
        raise RecipeError(f"{where}: {FIELD}.step: {ref.step} trained another model (train.model differs in "
                          f"{diff}); rule: a checkpoint continues into the same model shape")
    if config.get("batch_size") != train.batch_size:
        raise RecipeError(f"{where}: {FIELD}.step: {ref.step} ran batch_size {config.get('batch_size')}, this recipe "
                          f"says {train.batch_size}; rule: the batch order continues only at the same batch size")
    manifest = _checkpoint(storage, parent, ref, where)
    step = int(manifest["step"])
    problem = continuation_problem(train, step)
    if problem:
        raise RecipeError(f"{where}: {FIELD}: {problem}")
    resolved = {**ref.model_dump(), "checkpoint_step": step, "checkpoint_root_hash": manifest["root_hash"],
                "data_seed": derive_seed(int(config["seed"]), parent.hash_input["name"])}
    return parent, resolved
