"""A continued run's first state: the parent train step's checkpoint, brought into this step's own.

``train.continue_from`` (:class:`tidal.train.config.ResolvedContinue`) names a checkpoint of a
committed train step, read from the input :data:`tidal.train.config.CONTINUE_INPUT` (its directory on
a local root, its URI in the bucket: nothing else). When this step has no verified checkpoint of its
own yet, :func:`adopt_parent_checkpoint` copies (or downloads) that checkpoint and its manifest into
this step's ``checkpoints/`` and ``checkpoint_manifests/`` (on an object-store root a sharded one is
copied inside the bucket into this step's staging location instead: :func:`adopt_parent_in_bucket`),
refusing one whose manifest root hash is not the planned one, so the ordinary restore
(:meth:`tidal.train.checkpoints.Checkpointer.restore_latest`) verifies every file and loads it like a
checkpoint of this run; the parent's committed directory is never written. A continued run that was
interrupted resumes from its own newest checkpoint instead.

``metrics.jsonl`` starts with the parent's lines up to the checkpoint's step, so the curve of a
continued run is the whole curve of the model (the parent's lines as the parent measured them).

What continues (decided here, documented in docs/how-to/continue-training.md):

* ``schedule: continue`` restores parameters and optimizer state (Adam moments and the update
  count the optax schedule reads), and the schedule is this step's optimizer over all ``steps``.
  Continuing N more updates of a run whose schedule agrees with that one over its updates (a
  constant LR after warmup, ``min_lr_ratio: 1.0``) is bitwise one uninterrupted run of the
  combined length (tests/train/test_continue.py), because batch ``i`` is the parent's batch order
  (its seed) continued and a restore is exact. With a cosine decay the parent's schedule ended at
  its own ``steps``; the continuation jumps to this schedule's LR at the seam.
* ``schedule: rewarm`` restores the parameters only: fresh AdamW state and a new warmup and cosine
  decay over the ``steps - checkpoint_step`` new updates.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tidal.context import is_uri
from tidal.integrity.hashing import verify_manifest
from tidal.storage import uris
from tidal.storage.layout import atomic_write_text
from tidal.train import shards
from tidal.train.config import CONTINUE_INPUT, ConfigError, ResolvedContinue
from tidal.train.mirror import CHECKPOINT_DIR, MANIFEST_DIR, CheckpointMirror

METRICS = "metrics.jsonl"

__all__ = ["adopt_parent_checkpoint", "adopt_parent_in_bucket", "continue_from_parent", "continued_root_hash",
           "parent_location", "parent_metrics"]


def parent_location(spec: dict[str, Any]) -> str:
    """Where the parent train step lives (``spec.json`` ``inputs``; a directory or a bucket URI).

    Raises:
        ConfigError: the spec continues a run but has no :data:`CONTINUE_INPUT` input.
    """
    ref = spec["config"].continue_from if hasattr(spec.get("config"), "continue_from") else None
    name = ref.input if ref is not None else CONTINUE_INPUT  # an in-recipe branch names its trunk's step
    try:
        return str(spec["inputs"][name])
    except (KeyError, TypeError):
        raise ConfigError(f"train config continues a run (continue_from) but the step has no input "
                          f"{name!r}; inputs: {sorted(spec.get('inputs') or {})}") from None


def adopt_parent_checkpoint(ref: ResolvedContinue, parent: str, checkpoints_dir: Path, manifests_dir: Path) -> None:
    """Bring the parent's checkpoint ``ref.checkpoint_step`` into this step's checkpoint directories.

    Args:
        ref: the resolved reference (step, root hash) from the step config.
        parent: the parent step's location (:func:`parent_location`).
        checkpoints_dir, manifests_dir: this step's ``checkpoints/`` and ``checkpoint_manifests/``.

    Raises:
        ConfigError: the parent's checkpoint is missing, does not verify against its manifest, or its
            manifest's root hash is not ``ref.checkpoint_root_hash`` (what the step id was planned on).
    """
    step = ref.checkpoint_step
    dest = checkpoints_dir / str(step)
    shutil.rmtree(dest, ignore_errors=True)
    where = f"{parent.rstrip('/')}/{CHECKPOINT_DIR}/{step}"
    if is_uri(parent):
        manifest = CheckpointMirror(parent).fetch(step, dest)
        problems = [] if manifest is not None else ["missing or does not verify against its manifest (see the log)"]
    else:
        source = Path(parent) / CHECKPOINT_DIR / str(step)
        try:
            manifest = json.loads((Path(parent) / MANIFEST_DIR / f"{step}.json").read_text())
            problems = verify_manifest(source, manifest)
        except (OSError, ValueError) as err:
            manifest, problems = None, [f"manifest unreadable: {type(err).__name__}: {err}"]
        if not problems:
            shutil.copytree(source, dest)
    planned = ref.checkpoint_root_hash  # None: a trunk of the same recipe, named by its id (content-addressed)
    if manifest is not None and not problems and planned is not None and manifest.get("root_hash") != planned:
        problems = [f"manifest root hash {manifest.get('root_hash')} is not the planned {ref.checkpoint_root_hash}"]
    if problems:
        shutil.rmtree(dest, ignore_errors=True)
        raise ConfigError(f"continue_from: checkpoint {where} of {ref.step}: {'; '.join(problems[:3])}; rule: a "
                          "run continues exactly the checkpoint its step id was planned on (plan the recipe again)")
    manifests_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(manifests_dir / f"{step}.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def adopt_parent_in_bucket(ref: ResolvedContinue, parent: str, location: str) -> dict[str, Any] | None:
    """Bring the parent's *sharded* checkpoint ``ref.checkpoint_step`` into this step's staging location
    ``location`` inside the bucket (a server-side copy of its objects, its manifest last), so a run on an
    object-store root restores it as one of its own (every chunk checked as it is read) and no disk holds it.

    Returns:
        The parent checkpoint's manifest, or None when the parent's checkpoint there is not a sharded one
        (an orbax checkpoint: :func:`adopt_parent_checkpoint` fetches it).

    Raises:
        ConfigError: its objects are not all there at their sizes, or its manifest's root hash is not
            ``ref.checkpoint_root_hash``.
    """
    step = ref.checkpoint_step
    manifest = shards.read_manifest(parent, step)
    if manifest is None:
        return None
    where = f"{parent.rstrip('/')}/{CHECKPOINT_DIR}/{step}"
    problems = shards.problems(parent, manifest)
    planned = ref.checkpoint_root_hash
    if not problems and planned is not None and manifest.get("root_hash") != planned:
        problems = [f"manifest root hash {manifest.get('root_hash')} is not the planned {planned}"]
    if problems:
        raise ConfigError(f"continue_from: checkpoint {where} of {ref.step}: {'; '.join(problems[:3])}; rule: a "
                          "run continues exactly the checkpoint its step id was planned on (plan the recipe again)")
    uris.copy_dir(uris.join(parent, CHECKPOINT_DIR, str(step)), uris.join(location, CHECKPOINT_DIR, str(step)),
                  [f["path"] for f in manifest["files"]])
    # the manifest last, copied as it is (not read again): from then on the checkpoint counts here
    uris.copy_dir(uris.join(parent, MANIFEST_DIR), uris.join(location, MANIFEST_DIR), [f"{step}.json"])
    return manifest


def continue_from_parent(session: Any) -> tuple[int, Any, dict[str, Any]]:
    """The first start of a continued run (``session``: :class:`tidal.train.trainer.Session`): the parent's
    checkpoint, adopted into this step's own and restored; with ``schedule: rewarm`` a fresh optimizer state.
    The parent's metrics up to the checkpoint open this run's ``metrics.jsonl``.

    Returns:
        ``(step, state, manifest)`` with ``manifest["continued"]`` True.

    Raises:
        ConfigError: the parent's checkpoint is missing, does not verify or is not the planned one.
    """
    import jax

    run, ckpt, ref = session.run, session.ckpt, session.run.cfg.continue_from
    parent = parent_location(session.spec)
    # on a bucket, a sharded parent checkpoint is copied inside the bucket (process 0; the others wait for it at
    # the restore's first collective); any other is fetched: a shared disk gets one copy, else every process its own
    in_bucket = ckpt.sharded and shards.read_manifest(parent, ref.checkpoint_step) is not None
    if in_bucket and session.primary:
        adopt_parent_in_bucket(ref, parent, ckpt.mirror.location)
    elif not in_bucket and (session.primary or ckpt.sharded):
        adopt_parent_checkpoint(ref, parent, ckpt.path(ref.checkpoint_step).parent, session.step_dir / MANIFEST_DIR)
    if jax.process_count() > 1 and not ckpt.sharded:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("tidal-continue-from")
    restored = ckpt.restore_latest(session.abstract)
    if restored is None or restored[0] != ref.checkpoint_step:
        raise ConfigError(f"continue_from: checkpoint {ref.checkpoint_step} of {ref.step} was copied but does not "
                          "restore (see the log)")
    step, state, manifest = restored
    if ref.schedule == "rewarm":
        state = {"params": state["params"], "opt_state": run.fresh_opt_state(state["params"])}
    if session.primary:
        atomic_write_text(session.metrics_path, parent_metrics(parent, step))
        if ckpt.mirror is not None and in_bucket:  # the metrics beside it, as a save leaves them
            uris.write_bytes(uris.join(ckpt.mirror.location, METRICS), session.metrics_path.read_bytes())
        elif ckpt.mirror is not None:  # it counts in this step's staging too: a fresh node resumes from there
            ckpt.mirror.upload(step, ckpt.path(step), manifest, {METRICS: session.metrics_path.read_bytes()})
    print(f"continuing {ref.step} from its checkpoint step {step} (root {str(manifest.get('root_hash'))[:12]}, "
          f"schedule {ref.schedule}) to step {run.cfg.steps}", flush=True)
    return step, state, {**manifest, "continued": True}


def continued_root_hash(ref: ResolvedContinue, manifests_dir: Path) -> str | None:
    """The root hash of the parent checkpoint this run continued: the planned one, or for a branch planned with
    its trunk (none planned) the one :func:`adopt_parent_checkpoint` adopted into ``manifests_dir``."""
    if ref.checkpoint_root_hash is not None:
        return ref.checkpoint_root_hash
    adopted = manifests_dir / f"{ref.checkpoint_step}.json"
    return json.loads(adopted.read_text()).get("root_hash") if adopted.exists() else None


def parent_metrics(parent: str, step: int) -> str:
    """The parent's ``metrics.jsonl`` lines with ``step <= step`` ('' when it has none)."""
    try:
        if is_uri(parent):
            from tidal.storage import uris

            text = uris.read_bytes(uris.join(parent, METRICS)).decode()
        else:
            text = (Path(parent) / METRICS).read_text()
    except FileNotFoundError:
        return ""
    lines = [line for line in text.splitlines() if line.strip()]
    return "".join(line + "\n" for line in lines if json.loads(line)["step"] <= step)
