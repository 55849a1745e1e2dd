"""``tidal lineage``: the chain from source archives through every step to the final checkpoint.

Invariant: the chain is read from what was committed, not from what a recipe would plan
today: each step's ``step.json`` names the ids of its inputs (``hash_input.inputs``), so the
walk from the final step back to the ``fetch`` steps (which name their archive: registry,
package, version, sha256) holds even after the recipe file changed. The recipe (or, for an
MLflow run key, the tags its parent run recorded) adds what steps do not compute with: the
licence of each source, its permitted uses and any override. Steps not committed yet are
taken from the recipe's graph and shown as such.

Targets (:func:`resolve_target`, shared with ``tidal verify``): a recipe file, a step
directory, a step id in a storage root, or an MLflow run key (the parent run's
``tidal.run_key``, e.g. ``tidal_tiny__manual__2026-...`` or ``cli__20261130T...``).
``tidal verify`` and ``tidal lineage`` treat a target alike: one that names nothing (a
missing path, a directory that is not a step directory, a file that is not a recipe, an
unknown step id or run key) is a :class:`TargetError`, exit status 2, one ``error:`` line;
a target whose steps are none of them committed exits 1 with :func:`nothing_committed`'s line
after printing what is known (planned steps, mismatches).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidal.audit.catalog import run_plan, tag_overrides
from tidal.core.load import load_pipeline
from tidal.quality.licences import licence_decisions
from tidal.settings import current as current_settings
from tidal.storage import LocalStorage, open_storage
from tidal.storage.layout import MANIFEST_JSON, STEP_JSON, SUCCESS
from tidal.tracking import STEP_TAG_PREFIX, parent_run_in_any_experiment, safe_uri, tracking_uri_for
from tidal.train import CHECKPOINT_MANIFEST

#: Files the commit protocol writes; a directory holding none of them is not a step directory.
STEP_MARKERS = (STEP_JSON, MANIFEST_JSON, SUCCESS)
#: Packages shown in a step's environment summary (the rest stay in step.json).
SUMMARY_PACKAGES = ("tidal", "numpy", "apache-beam", "tokenizers", "jax", "jaxlib", "flax", "orbax-checkpoint")


class TargetError(ValueError):
    """A verify/lineage target names no recipe, step or run (the message lists what was tried)."""


@dataclass
class Target:
    """What a target resolved to.

    Attributes:
        storage: the storage root holding the steps.
        steps: ``{step name: step id}`` in graph order (inputs first) when known.
        final: ids of the steps the chain ends at (the last step of a recipe or run, or the one step).
        pipe: the loaded :class:`tidal.core.pipeline.Pipeline`, when a recipe is known.
        run: MLflow parent run (``run_id``, ``run_key``, tags) for a run-key target.
        label: the target as the user wrote it (for messages).
    """

    kind: str
    storage: Any
    steps: dict[str, str]
    final: list[str]
    pipe: Any = None
    run: dict[str, Any] = field(default_factory=dict)
    label: str = ""


def _storage_from(storage_root: str | None, recipe: str | None, target: str) -> tuple[Any, Any]:
    """(storage, pipeline or None) from --storage-root, $TIDAL_STORAGE_ROOT or --recipe."""
    pipe = None
    if recipe:
        pipe = load_pipeline(recipe, storage_root=storage_root)
        return pipe.storage, pipe
    root = storage_root or current_settings().storage_root
    if not root:
        raise TargetError(f"{target}: a step id or run key needs a storage root: pass --recipe RECIPE or "
                          "--storage-root DIR (or set TIDAL_STORAGE_ROOT)")
    return open_storage(root), None


def _where(storage: Any) -> str:
    """The storage root as text (``uri`` where the backend has it)."""
    return str(getattr(storage, "uri", None) or storage.root)


def resolve_target(target: str, recipe: str | None = None, storage_root: str | None = None) -> Target:
    """Resolve a ``tidal verify`` / ``tidal lineage`` argument.

    Tried in order: a recipe file (``.yaml``/``.yml``); a step directory (holds one of
    :data:`STEP_MARKERS`); a step id under the storage root (committed, or its directory holds
    ``step.json`` or ``manifest.json``); an MLflow run key (parent run tagged ``tidal.run_key``)
    in the tracking store of ``--recipe`` / ``$MLFLOW_TRACKING_URI`` / the storage root's
    embedded store. A target written as a path (it holds ``/`` or ends in ``.yaml``/``.yml``)
    is only ever a path: when it names nothing usable the error says so, whatever the storage root.

    Raises:
        TargetError: a missing path, a directory that is not a step directory, a file that is
            not a recipe, nothing matched, or a step id / run key came without a storage root.
        tidal.recipe.RecipeError: the recipe file is invalid.
        tidal.tracking.TrackingUnavailable: the target is no step, so it may be a run key, and
            MLflow does not answer (``tidal lineage`` then shows ``--recipe``'s steps instead).
    """
    path = Path(target)
    if "://" in target:
        raise TargetError(f"{target}: a URL is not a target; pass the step id and the root, e.g. "
                          "`STEP_ID --storage-root s3://bucket/root`")
    as_path = "/" in target or os.sep in target or path.suffix in (".yaml", ".yml")
    if path.is_file():
        if path.suffix in (".yaml", ".yml"):
            pipe = load_pipeline(path, storage_root=storage_root)
            steps = {s.name: s.step_id for s in pipe.graph}
            return Target("recipe", pipe.storage, steps, [_final_step(pipe.graph).step_id], pipe, label=target)
        if as_path:
            raise TargetError(f"{target}: a file, but not a recipe (.yaml or .yml); a target is a recipe file, a "
                              "step directory, a step id or an MLflow run key")
    elif path.is_dir():
        if any((path / name).is_file() for name in STEP_MARKERS):
            path = path.resolve()
            return Target("step", LocalStorage(path.parent), {}, [path.name], None, label=target)
        if as_path:
            raise TargetError(f"{target}: a directory, but not a step directory (it holds none of "
                              f"{', '.join(STEP_MARKERS)})")
    elif as_path:
        raise TargetError(f"{target}: no such file or directory")
    storage, pipe = _storage_from(storage_root, recipe, target)
    if _is_stored_step(storage, target):
        return Target("step", storage, {}, [target], pipe, label=target)
    run = _find_run(target, pipe, storage)
    if run is None:
        if Path(storage.step_dir(target)).is_dir():
            raise TargetError(f"{target}: a directory under {_where(storage)}, but not a step directory (it holds "
                              f"none of {', '.join(STEP_MARKERS)})")
        raise TargetError(f"{target}: not a recipe file, a step directory, a step id under {_where(storage)} "
                          "or an MLflow run key in its tracking store")
    steps = {k[len(STEP_TAG_PREFIX):]: v for k, v in run["tags"].items() if k.startswith(STEP_TAG_PREFIX)}

    plan = run_plan(storage, run["tags"].get("tidal.recipe", ""), target)  # every step the run planned
    if plan is not None:
        steps = {**plan["steps"], **steps}
    recipe_path = run["tags"].get("tidal.recipe_path") or (str(pipe.recipe_path) if pipe is not None else None)
    if recipe_path and Path(recipe_path).is_file():
        try:  # the recipe with the run's own overrides (its trigger form), so its graph has the run's ids
            overrides = tag_overrides(run["tags"]) or (plan or {}).get("overrides")
            pipe = load_pipeline(recipe_path, overrides or None, storage_root=_where(storage))
        except Exception as err:  # noqa: BLE001 - the recipe may have changed since the run; its tags remain
            run["recipe_error"] = f"{type(err).__name__}: {err}"
    if pipe is not None:
        order = {s.name: i for i, s in enumerate(pipe.graph)}
        steps = dict(sorted(steps.items(), key=lambda kv: order.get(kv[0], len(order))))
    final = [steps[_final_step(pipe.graph).name]] if pipe is not None and _final_step(pipe.graph).name in steps else (
        list(steps.values())[-1:])
    return Target("run", storage, steps, final, pipe, run, label=target)


def _final_step(graph: Any) -> Any:
    """The step a recipe's lineage ends at: its ``train`` step (decay branches planned after it read it, and are
    targets of their own), else the last step that is not an eval (an eval step reads it and adds no data)."""
    if "train" in graph.by_name:
        return graph["train"]
    return [s for s in graph if s.kind != "eval"][-1]


def _is_stored_step(storage: Any, step_id: str) -> bool:
    """True when ``step_id`` is committed under ``storage`` or its directory (objects) holds
    ``step.json`` or ``manifest.json`` (a step whose ``_SUCCESS`` is missing is still a step)."""
    if storage.is_committed(step_id):
        return True
    for name in STEP_MARKERS[:2]:
        try:
            storage.read_text(step_id, name)
        except OSError:  # FileNotFoundError: not there; IsADirectoryError: not a step file either
            continue
        return True
    return False


def nothing_committed(target: Target) -> str:
    """The error line ``tidal verify`` and ``tidal lineage`` print (exit 1) when none of a resolved
    target's steps is committed."""
    ids = list(target.steps.values()) or target.final
    hint = {"recipe": "run it first (`tidal run RECIPE`)",
            "step": "`tidal verify` lists what is missing",
            "run": "the run has not committed a step (yet)"}.get(target.kind, "")
    return (f"nothing committed for {target.kind} {target.label or ', '.join(ids)}: none of its {len(ids)} "
            f"step(s) has _SUCCESS under {_where(target.storage)}; {hint}")


def _find_run(run_key: str, pipe: Any, storage: Any) -> dict[str, Any] | None:
    """The MLflow parent run tagged ``tidal.run_key = run_key`` in any experiment, or None.

    Raises:
        tidal.tracking.TrackingUnavailable: MLflow does not answer (its message names the URI).
    """
    if "'" in run_key:
        return None

    uri = pipe.tracking_uri if pipe is not None else tracking_uri_for(getattr(storage, "local_dir", storage.root))
    run = parent_run_in_any_experiment(uri, run_key)
    if run is None:
        return None
    return {"run_id": run.run_id, "run_key": run_key, "tracking_uri": safe_uri(uri), "tags": dict(run.tags)}


def _read_record(storage: Any, step_id: str) -> dict[str, Any] | None:
    """A committed step's step.json (through ``storage.read_text`` when the backend has it)."""
    if not storage.is_committed(step_id):
        return None
    reader = getattr(storage, "read_text", None)
    if callable(reader):
        text = reader(step_id, STEP_JSON)
    else:
        text = (Path(storage.step_dir(step_id)) / STEP_JSON).read_text()
    return json.loads(text)


def environment_summary(env: dict[str, Any] | None) -> str:
    """One line from a step.json ``environment`` fingerprint: Python, machine, key packages, devices."""
    if not env:
        return "not recorded"
    parts = [f"python {env.get('python')}", str(env.get("machine", ""))]
    packages = env.get("packages") or {}
    parts += [f"{name} {packages[name]}" for name in SUMMARY_PACKAGES if name in packages]
    devices = env.get("devices")
    if isinstance(devices, dict) and "backend" in devices:
        parts.append(f"{devices.get('backend')} {devices.get('device_kind')} x{devices.get('device_count')}")
    return ", ".join(p for p in parts if p)


def _workload_environment(storage: Any, step_id: str) -> dict[str, Any] | None:
    """The fingerprint the trainer recorded with its latest checkpoint (``checkpoint_manifest.json``)."""
    reader = getattr(storage, "read_text", None)
    try:
        text = (reader(step_id, CHECKPOINT_MANIFEST) if callable(reader)
                else (Path(storage.step_dir(step_id)) / CHECKPOINT_MANIFEST).read_text())
        fingerprint = json.loads(text).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None
    return fingerprint if isinstance(fingerprint, dict) else None


def _signature_summary(record: dict[str, Any]) -> str:
    signing = record.get("signing")
    if not isinstance(signing, dict):
        return "unsigned (not recorded)"
    if signing.get("status") == "signed":
        return f"signed {signing.get('algorithm')} key {signing.get('key_id')}"
    return "unsigned"


def build_lineage(target: Target) -> dict[str, Any]:
    """The lineage of a resolved target as JSON-able data.

    Returns:
        ``{"target", "recipe", "intended_use", "sources": [{name, format, registry, package,
        version, filename, archive_sha256, licence, permitted_uses, licence_override, rule}],
        "steps": [{name, kind, step_id, committed, inputs, manifest_root_hash, signature,
        environment, environment_summary}], "final": {step_id, manifest_root_hash,
        checkpoint_root_hash, params_sha256}}``; steps in chain order (inputs first).
    """
    graph = {s.step_id: s for s in target.pipe.graph} if target.pipe is not None else {}
    names = {sid: name for name, sid in target.steps.items()}
    nodes: dict[str, dict[str, Any]] = {}

    def visit(step_id: str) -> None:
        if step_id in nodes:
            return
        record = _read_record(target.storage, step_id)
        planned = graph.get(step_id)
        if record is not None:
            hash_input = record.get("hash_input") or {}
            inputs = dict(hash_input.get("inputs") or {})
            node = {"name": hash_input.get("name", names.get(step_id, step_id)), "kind": hash_input.get("kind"),
                    "step_id": step_id, "committed": True, "inputs": inputs,
                    "config": hash_input.get("config") or {},
                    "manifest_root_hash": record.get("manifest_root_hash"),
                    "signature": _signature_summary(record),
                    "environment": record.get("environment"),
                    "environment_summary": environment_summary(record.get("environment")),
                    "summary": record.get("summary") or {}}
            workload = _workload_environment(target.storage, step_id) if node["kind"] == "train" else None
            if workload is not None:  # the training process itself (devices), not the committing one
                node["workload_environment"] = workload
                node["workload_environment_summary"] = environment_summary(workload)
        elif planned is not None:
            inputs = {d.name: d.step_id for d in planned.inputs}
            node = {"name": planned.name, "kind": planned.kind, "step_id": step_id, "committed": False,
                    "inputs": inputs, "config": dict(planned.config), "manifest_root_hash": None,
                    "signature": "not committed", "environment": None, "environment_summary": "not committed",
                    "summary": {}}
        else:
            nodes[step_id] = {"name": names.get(step_id, step_id), "kind": None, "step_id": step_id,
                              "committed": False, "inputs": {}, "config": {}, "manifest_root_hash": None,
                              "signature": "not found", "environment": None,
                              "environment_summary": "not found in storage", "summary": {}}
            return
        for dep in inputs.values():
            visit(dep)
        nodes[step_id] = node

    for final in target.final:
        visit(final)
    for sid in target.steps.values():  # a run's steps outside the final chain (none for a pipeline)
        visit(sid)

    sources = _sources(nodes, target)
    final_node = nodes.get(target.final[-1]) if target.final else None
    final = {}
    if final_node is not None:
        final = {"step": final_node["name"], "step_id": final_node["step_id"],
                 "manifest_root_hash": final_node["manifest_root_hash"],
                 "checkpoint_root_hash": final_node["summary"].get("checkpoint_root_hash"),
                 "params_sha256": final_node["summary"].get("params_sha256")}
    recipe = target.pipe.recipe if target.pipe is not None else None
    tags = target.run.get("tags", {})
    intended = (tags.get("tidal.intended_use", "").split(",") if tags.get("tidal.intended_use")
                else list(recipe.intended_use) if recipe is not None else [])
    steps = [{k: v for k, v in n.items() if k not in ("config", "summary")} for n in nodes.values()]
    return {"target": target.kind, "recipe": recipe.name if recipe is not None else tags.get("tidal.recipe"),
            "run": {k: v for k, v in target.run.items() if k != "tags"}, "intended_use": intended,
            "sources": sources, "steps": steps, "final": final}


def _sources(nodes: dict[str, dict[str, Any]], target: Target) -> list[dict[str, Any]]:
    """One entry per fetch step in the chain: archive from step.json, licence from recipe / run tags."""
    recipe = target.pipe.recipe if target.pipe is not None else None
    decisions = licence_decisions(recipe.sources, recipe.licences) if recipe is not None else {}
    tags = target.run.get("tags", {})
    out = []
    for node in nodes.values():
        if node["kind"] != "fetch":
            continue
        name = node["config"].get("source", node["name"].removeprefix("fetch-"))
        archive = node["config"].get("archive") or {}
        decision = decisions.get(name, {})
        licence = tags.get(f"tidal.licence.{name}") or decision.get("licence") or "unknown (no recipe given)"
        uses = tags.get(f"tidal.permitted_uses.{name}")
        override = tags.get(f"tidal.licence_override.{name}")
        out.append({
            "name": name, "format": node["config"].get("format"), "step_id": node["step_id"],
            "registry": archive.get("kind"), "package": archive.get("package"), "version": archive.get("version"),
            "filename": archive.get("filename"),
            "archive_sha256": node["summary"].get("archive_sha256") or archive.get("sha256"),
            # a source read from files (`path:`): where, what was read, and the snapshot hash of its files
            "path": node["config"].get("path") or node["summary"].get("path"),  # a pinned path is not hashed
            "documents": node["summary"].get("documents"),
            "bytes": node["summary"].get("bytes"),
            "snapshot_sha256": node["summary"].get("snapshot_sha256") or node["config"].get("snapshot_sha256"),
            "licence": licence,
            "permitted_uses": uses.split(",") if uses else decision.get("permitted_uses", []),
            "licence_override": json.loads(override) if override else decision.get("override"),
            "rule": decision.get("rule"),
        })
    return out


def format_lineage(lineage: dict[str, Any]) -> str:
    """Text form: sources (archive, sha256, licence), steps in chain order, the final checkpoint."""
    head = f"lineage of {lineage['target']}"
    if lineage.get("recipe"):
        head += f" (recipe {lineage['recipe']})"
    if lineage.get("run"):
        head += f", MLflow run {lineage['run'].get('run_id')} key {lineage['run'].get('run_key')}"
    lines = [head, f"intended use: {', '.join(lineage['intended_use']) or 'not recorded'}", "sources:"]
    for src in lineage["sources"]:
        if src.get("path") is not None and src.get("registry") is None:  # files, not a registry archive
            lines.append(f"  {src['name']:<8} files {src['path']} ({src.get('documents')} documents, "
                         f"{src.get('bytes')} bytes)  snapshot sha256 {src.get('snapshot_sha256') or 'not recorded'}")
        else:
            lines.append(f"  {src['name']:<8} {src['registry']} {src['package']}@{src['version']}  "
                         f"archive sha256 {src['archive_sha256']}")
        lines.append(f"  {'':<8} licence {src['licence']}, permits {', '.join(src['permitted_uses']) or '-'}"
                     + (f"; override: {src['licence_override']['reason']}" if src.get("licence_override") else ""))
    lines.append("steps (inputs first):")
    width = max((len(s["step_id"]) for s in lineage["steps"]), default=0)
    previous = None
    for step in lineage["steps"]:
        root = (step["manifest_root_hash"] or "-")[:16]
        lines.append(f"  {step['step_id']:<{width}}  {step['kind'] or '?':<9} root {root:<16}  {step['signature']}")
        env = step["environment_summary"]
        lines.append(f"  {'':<{width}}  env: {'as above' if env == previous and step['committed'] else env}")
        previous = env
        if step.get("workload_environment_summary"):
            lines.append(f"  {'':<{width}}  trained on: {step['workload_environment_summary']}")
    final = lineage.get("final") or {}
    if final:
        lines.append(f"final: {final['step_id']}  manifest root {final['manifest_root_hash']}")
        if final.get("checkpoint_root_hash"):
            lines.append(f"       checkpoint root {final['checkpoint_root_hash']}  params sha256 "
                         f"{final.get('params_sha256')}")
    return "\n".join(lines)
