"""Orbax checkpoints of the training state, each verified by a manifest of content hashes.

Layout under the step directory::

    checkpoints/<step>/...                 orbax CheckpointManager, one directory per step
    checkpoint_manifests/<step>.json       tidal.integrity.hashing.build_manifest(checkpoints/<step>)
                                           + "step" + "fingerprint" (tidal.integrity.fingerprint)
    checkpoint_manifest.json               the same, for the latest saved checkpoint

Saves are asynchronous (orbax ``enable_async_checkpointing``): :meth:`Checkpointer.save`
returns once the arrays are copied to host memory, orbax writes the files in a background
thread, and a second thread of ours waits for orbax to *finalise* the step (all processes
done, directory renamed into place) and only then hashes the files and writes the manifest.
With ``host_state`` (the trainer on the CPU backend: arrays in host memory, never donated)
orbax's save call runs in that thread too, so the training loop does not wait at all.
Retention (orbax ``preservation_policy``): the newest ``keep`` checkpoints, plus every
checkpoint whose step is a multiple of ``permanent_every`` (kept forever). In the bucket the same
rule (:func:`retained`) is applied to every checkpoint there, the earlier processes' included: a
resumed process on an empty disk fetches only the newest one, so orbax there knows of no other.

Format: an orbax PyTree checkpoint (OCDBT + zarr2), **uncompressed**: trained float weights
and Adam moments are close to incompressible (zstd shrinks random float32 by ~7%), and zstd
cost ~35 ms of CPU per 19 MB saved on the 2-core bench host. Two layouts:

* tree: one orbax array per leaf of the state (every multi-process or device-resident save);
* packed: every leaf of a dtype concatenated (:mod:`tidal.train.packing`, which says when and why),
  for a ``host_state`` save of up to :data:`tidal.train.packing.PACK_MAX_BYTES`.

Both layouts, and the compressed checkpoints of earlier versions, restore into either kind of run
(a packed one into a multi-process run too: tests/train/test_distributed.py checks it bit for bit).

On an object-store root (``mirror``: the step's staging location), with one process or many, no disk
stages a checkpoint and nothing is gathered: every process writes the shards it owns straight to the
bucket (:mod:`tidal.train.shards`: TensorStore, one zarr array per leaf, a record per process, the
manifest last once every record is in), and a restore reads, on every process, only its own shards of
the newest sharded checkpoint process 0 chose (a broadcast of its step), into whatever mesh this run has,
each chunk checked against the manifest's sha256. An orbax checkpoint there (one written before sharded
saves covered single-process runs, or a continuation's parent) is still fetched whole and restored as
before (:mod:`tidal.train.mirror`). A sharded checkpoint of a committed step restores here too
(:meth:`restore`).

Invariant (docs/contracts.md, "Checkpoints"): a checkpoint is loaded only if its manifest
exists and every file's size and sha256 match, and only into a state of exactly the same
tree, shapes and dtypes (else :class:`CheckpointMismatch`; never a partial load). A
checkpoint without a manifest is one whose save was cut short and is skipped like a
corrupted one. Skipped checkpoints newer than the one restored are deleted, so the re-done
steps can save again under the same numbers. In a multi-process run only process 0 writes
manifests; every process verifies before restoring.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from tidal.integrity.hashing import build_manifest, verify_manifest
from tidal.storage import uris
from tidal.train import CHECKPOINT_MANIFEST, restore, shard_arrays, shards
from tidal.train.mirror import CHECKPOINT_DIR, MANIFEST_DIR, CheckpointMirror, retained, write_json_atomic
from tidal.train.orbax_logs import quiet_failed_saves
from tidal.train.packing import pack_state
from tidal.train.restore import CheckpointMismatch
from tidal.train.tree_hash import tree_sha256

LATEST_MANIFEST = CHECKPOINT_MANIFEST  # the one name: tidal/train/__init__.py (a light import)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:2000] if text else ""


class CheckpointSaveFailed(RuntimeError):
    """Saving a checkpoint failed (a full disk, an unreachable bucket); the message names the
    checkpoint and the cause. Earlier checkpoints stay verified and restorable."""


class Checkpointer:
    """Saves and restores the training-state pytree (``{"params", "opt_state"}``) under ``step_dir``.

    Args:
        step_dir: the training step's output directory.
        keep: how many of the newest checkpoints to keep (``keep_checkpoints``), >= 1.
        permanent_every: also keep every checkpoint whose step is a multiple of this (None: none).
        log: logger for skipped/deleted checkpoints.
        async_save: write in the background (orbax async checkpointing); False waits in save().
        primary: this process writes manifests (process 0 of a multi-process run).
        on_manifest: called with each manifest once written (e.g. to tag MLflow); must not raise.
        read_only: only verify and restore (a committed step's checkpoints: export, sample, evals): no directory
            is created, no leftover temporary one removed (orbax's ``read_only``).
        mirror: the step's staging location in the bucket (:mod:`tidal.train.mirror`): every
            checkpoint is written there and counts only once its manifest is; a restore takes the
            newest checkpoint there that verifies. Every process writes its own shards there
            (:mod:`tidal.train.shards`) and nothing is gathered or staged on a disk.
        fence: with a mirror, called before every upload that makes a checkpoint count (the training
            lease's check, :mod:`tidal.train.fence`); what it raises fails that save.
        commit_wait_s: multi-process with a mirror: how long process 0 waits for every process's record of
            a checkpoint before that save fails (a peer gone).
        host_state: the saved arrays live in host memory and the caller neither mutates nor
            donates them before :meth:`wait` (the trainer on the CPU backend). Then the whole
            save, orbax's save call included, runs in the background thread (:meth:`save`
            returns at once) and states up to :data:`PACK_MAX_BYTES` are saved packed.
            Ignored in a multi-process run without a mirror (orbax's save call holds a cross-process
            barrier that must stay in step with the training collectives) and with ``async_save=False``.
    """

    def __init__(self, step_dir: str | Path, keep: int, log: logging.Logger | None = None, *,
                 permanent_every: int | None = None, async_save: bool = True, primary: bool = True,
                 on_manifest: Callable[[dict[str, Any]], None] | None = None,
                 host_state: bool = False, mirror: str | None = None, commit_wait_s: float = 600.0,
                 fence: Callable[[], None] | None = None, read_only: bool = False):
        if keep < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {keep}")
        if permanent_every is not None and permanent_every < 1:
            raise ValueError(f"permanent_every must be >= 1 or None, got {permanent_every}")
        self.step_dir = Path(step_dir).absolute()
        self.log = log or logging.getLogger("tidal.train.checkpoints")
        quiet_failed_saves()  # a failed save is one error line, not orbax's five tracebacks
        self.primary, self.on_manifest, self.commit_wait_s = primary, on_manifest, commit_wait_s
        self.keep, self.permanent_every = keep, permanent_every
        self.read_only = read_only
        if not read_only:
            (self.step_dir / MANIFEST_DIR).mkdir(parents=True, exist_ok=True)
        # to the bucket, with one process or many: nothing is staged on a disk (a pod's /tmp is smaller than a
        # big state) and no disk is shared; each process writes and reads its own shards there, and for the
        # orbax checkpoints it may still restore (fetched whole) it is an orbax domain of its own (no
        # cross-process barrier in orbax)
        self.sharded = mirror is not None
        self.mirror = CheckpointMirror(mirror, self.log, fence=fence) if mirror is not None else None
        for tmp in [] if read_only else sorted((self.step_dir / CHECKPOINT_DIR).glob("*.orbax-checkpoint-tmp*")):
            self.log.warning("removing %s: a save cut short before it finished (never counted)", tmp)
        policies = [pp.LatestN(keep)] + ([pp.EveryNSteps(permanent_every)] if permanent_every else [])
        # leftover tmp dirs of a save cut short by a crash are removed on start
        here = jax.process_index()
        processes = (ocp.options.MultiprocessingOptions(primary_host=here, active_processes={here},
                                                        barrier_sync_key_prefix=f"tidal-process-{here}")
                     if self.sharded else ocp.options.MultiprocessingOptions())
        if not read_only:
            (self.step_dir / CHECKPOINT_DIR).mkdir(parents=True, exist_ok=True)  # no create= with active_processes
        # read_only (export, sample, evals of a committed step): orbax neither creates nor cleans anything there
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=async_save, create=not (self.sharded or read_only),
            cleanup_tmp_directories=not read_only, read_only=read_only,
            preservation_policy=pp.AnyPreservationPolicy(policies), multiprocessing_options=processes)
        # the handler is named up front so a fresh process can read a checkpoint's metadata;
        # uncompressed: see the module docstring
        self.manager = ocp.CheckpointManager(
            self.step_dir / CHECKPOINT_DIR, options=options,
            item_handlers=ocp.PyTreeCheckpointHandler(use_compression=False, multiprocessing_options=processes))
        self.host_state = bool(host_state) and (jax.process_count() == 1 or self.sharded) and async_save
        # one long-lived worker: handing it a save costs no thread start, which under
        # CPU contention can take tens of ms of the caller's time
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tidal-checkpoint")
        self._job: Future | None = None
        self._error: BaseException | None = None
        self.last_manifest: dict[str, Any] | None = None
        # (step, seconds save() blocked the caller, seconds until orbax finished writing)
        self.save_seconds: list[tuple[int, float, float]] = []
        self._pending: tuple[int, float] = (0, 0.0)  # (step, blocking) of the save in flight
        self._sidecars: dict[str, bytes] = {}  # uploaded with the save in flight (mirror only)
        self._trainer: dict[str, Any] | None = None  # loop state kept in the manifest of the save in flight
        self._params_sha256: str | None = None  # of the save in flight: a permanent checkpoint's parameters
        self._written: float | None = None  # set by the background thread once orbax finished
        self._save_failed = False  # a save failed (reported as CheckpointSaveFailed)

    def path(self, step: int) -> Path:
        """Directory of the checkpoint at ``step``."""
        return self.step_dir / CHECKPOINT_DIR / str(step)

    def manifest_path(self, step: int) -> Path:
        return self.step_dir / MANIFEST_DIR / f"{step}.json"

    def steps(self) -> list[int]:
        """Steps with a finished orbax checkpoint, ascending."""
        self.manager.reload()
        return sorted(set(self.manager.all_steps()) | set(self.local_sharded()))

    def local_sharded(self) -> dict[int, dict[str, Any]]:
        """The sharded checkpoints (:mod:`tidal.train.shards`) of a materialized step: step -> manifest."""
        found = {}
        for path in (self.step_dir / MANIFEST_DIR).glob("*.json"):
            if path.stem.isdigit() and self.path(int(path.stem)).is_dir():
                try:
                    manifest = json.loads(path.read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                if manifest.get("format") == shards.FORMAT:
                    found[int(path.stem)] = manifest
        return found

    def save(self, step: int, state: Any, fingerprint: dict[str, Any] | None = None,
             sidecars: dict[str, bytes] | None = None, trainer: dict[str, Any] | None = None) -> None:
        """Start saving ``state`` as the checkpoint of ``step`` (completed optimizer steps).

        Blocks only for the previous save to finish and for the device-to-host copy (not
        even for that with ``host_state``); the files and then the manifest (with
        ``fingerprint``) are written in the background, and with a mirror uploaded, ``sidecars``
        (name -> bytes, e.g. the metrics so far) before the manifest. Call :meth:`wait` for the
        manifest, :meth:`check` to learn of a failure without waiting. ``trainer``: host-side state
        of the loop as of this step (JSON), kept in the manifest under ``"trainer"`` (the divergence
        guard's loss history). A permanent checkpoint's manifest also holds ``params_sha256``
        (:func:`tree_sha256` of ``state["params"]``, computed here: it blocks for one host copy of the
        parameters, every ``permanent_every`` steps only), which MLflow's logged model of it is tagged
        with; with a mirror every process takes part (the hash is a collective), without one a
        multi-process run whose parameters are not all addressable from process 0 records none.

        Raises:
            CheckpointSaveFailed: the previous save failed, or this one failed at once (e.g. its
                directory cannot be created).
        """
        self.wait()
        self._sidecars = dict(sidecars or {})
        self._trainer = trainer
        start = time.perf_counter()
        if self.sharded:  # every process writes its own shards to the bucket (tidal.train.shards)
            self._params_sha256 = self._permanent_params_sha256(step, state)
            host = shard_arrays.copy_to_host(state, copy=not self.host_state)
            self._job = self._worker.submit(self._save_sharded, step, host, fingerprint, start)
            self._pending = (step, time.perf_counter() - start)
            return
        self._params_sha256 = self._permanent_params_sha256(step, state)
        if self.host_state:
            target, args = self._save_and_finish, (step, state, fingerprint, start)
        else:
            try:
                self._orbax_save(step, state)  # its synchronous part: the step's directory, the device copy
            except Exception as err:
                raise self._failed(step, err) from err
            target, args = self._finish, (step, fingerprint, start)
        self._job = self._worker.submit(target, *args)
        self._pending = (step, time.perf_counter() - start)

    def _permanent_params_sha256(self, step: int, state: Any) -> str | None:
        params = state.get("params") if isinstance(state, dict) else None
        if params is None or not self.permanent_every or step % self.permanent_every:
            return None
        if self.sharded:  # every process saves this step in its main thread, so the collective hash runs on all
            digest = tree_sha256(params)
            return digest if self.primary else None
        if not self.primary:
            return None
        if not all(getattr(leaf, "is_fully_addressable", True) for leaf in jax.tree_util.tree_leaves(params)):
            return None
        return tree_sha256(params)

    def _orbax_save(self, step: int, state: Any, custom_metadata: dict | None = None) -> None:
        self.manager.save(step, args=ocp.args.PyTreeSave(state, custom_metadata=custom_metadata), force=True)

    def _save_and_finish(self, step: int, state: Any, fingerprint: dict[str, Any] | None, start: float) -> None:
        try:
            packed = pack_state(state)
            self._orbax_save(step, *(packed or (state,)))
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread by wait()
            self._error = self._failed(step, err)
            return
        self._finish(step, fingerprint, start)

    def _save_sharded(self, step: int, host: shard_arrays.HostShards, fingerprint: dict[str, Any] | None,
                      start: float) -> None:
        """The background half of a multi-process save to the bucket: this process's shards, then (process 0)
        the sidecars, the manifest once every process's record is there, and retention in the bucket."""
        try:
            extra = {"fingerprint": fingerprint, **({"trainer": self._trainer} if self._trainer is not None else {}),
                     **({"params_sha256": self._params_sha256} if self._params_sha256 is not None else {})}
            manifest = shards.save(self.mirror, step, host, primary=self.primary, wait_s=self.commit_wait_s,
                                   extra=extra, sidecars=self._sidecars, log=self.log,
                                   retain=lambda there: retained(there, self.keep, self.permanent_every))
            self._written = time.perf_counter() - start
            if manifest is None:
                self.last_manifest = {"step": step}
                return
            write_json_atomic(self.step_dir / LATEST_MANIFEST, manifest)
            self.last_manifest = manifest
            if self.on_manifest is not None:
                self.on_manifest(manifest)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread by wait()
            self._error = self._failed(step, err)

    def _finish(self, step: int, fingerprint: dict[str, Any] | None, start: float) -> None:
        try:
            self.manager.wait_until_finished()
            self._written = time.perf_counter() - start
            if self.primary:
                manifest = {**build_manifest(self.path(step)), "step": step, "fingerprint": fingerprint}
                if self._trainer is not None:
                    manifest["trainer"] = self._trainer
                if self._params_sha256 is not None:
                    manifest["params_sha256"] = self._params_sha256
                write_json_atomic(self.manifest_path(step), manifest)
                live = set(self.manager.all_steps())  # orbax drops pruned steps from it at save time
                if self.mirror is not None:  # counts once its manifest is in the bucket
                    self.mirror.upload(step, self.path(step), manifest, self._sidecars)
                    self.log.info("checkpoint %d counts: in the bucket at %s (%d bytes, %.2f s)", step,
                                  self.mirror.location, *self.mirror.uploads[-1][1:])
                    # the bucket's own listing, not orbax's (which knows only what this process
                    # saved or fetched): an earlier process's permanent or newest-K ones stay
                    self.mirror.prune(lambda there: retained(set(there) | live, self.keep, self.permanent_every))
                write_json_atomic(self.step_dir / LATEST_MANIFEST, manifest)
                for path in (self.step_dir / MANIFEST_DIR).glob("*.json"):
                    if path.stem.isdigit() and int(path.stem) not in live:
                        path.unlink(missing_ok=True)
                self.last_manifest = manifest
                if self.on_manifest is not None:
                    self.on_manifest(manifest)
            else:
                self.last_manifest = {"step": step}
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread by wait()
            self._error = self._failed(step, err)

    def _failed(self, step: int, err: BaseException) -> CheckpointSaveFailed:
        self._save_failed = True
        where = (uris.join(self.mirror.location, CHECKPOINT_DIR, str(step)) if self.sharded else
                 f"{self.path(step)}" + (f" -> {self.mirror.location}" if self.mirror is not None else ""))
        failed = CheckpointSaveFailed(f"checkpoint of step {step} ({where}) was not saved: {type(err).__name__}: "
                                      f"{err}; earlier checkpoints are intact (rerun to resume from the newest)")
        failed.__cause__ = err
        return failed

    def check(self) -> None:
        """Raise at once if the save in flight has already failed; never waits.

        Raises:
            CheckpointSaveFailed: naming the checkpoint and the cause.
        """
        if self._job is not None and self._job.done() and self._error is not None:
            self.wait()

    def wait(self) -> dict[str, Any] | None:
        """Wait for the pending save and its manifest; return the newest manifest (None: no save yet).

        Raises:
            CheckpointSaveFailed: the background save failed (e.g. a full disk, the bucket unreachable).
        """
        if self._job is not None:
            self._job.result()  # the targets record their errors in self._error
            self._job = None
            (step, blocking), written = self._pending, self._written
            if written is not None:
                self.save_seconds.append((step, blocking, written))
            self._written = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return self.last_manifest

    def problems(self, step: int) -> list[str]:
        """Why the checkpoint at ``step`` may not be loaded; empty when its manifest matches."""
        mpath = self.manifest_path(step)
        if not mpath.is_file():
            return [f"{mpath}: no manifest (save did not finish)"]
        try:
            manifest = json.loads(mpath.read_text())
        except json.JSONDecodeError as err:
            return [f"{mpath}: unreadable manifest ({err})"]
        return verify_manifest(self.path(step), manifest)

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """Restore the newest checkpoint whose manifest verifies (:func:`tidal.train.restore.restore_latest`).

        Returns:
            ``(step, state, manifest)``, or None when no checkpoint verifies (start fresh).

        Raises:
            CheckpointMismatch: the newest verified checkpoint does not fit ``abstract_state``.
        """
        return restore.restore_latest(self, abstract_state)

    def restore(self, chosen: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Load the verified checkpoint of step ``chosen`` (:func:`tidal.train.restore.restore`); writes nothing.

        Returns:
            ``(state, manifest)``.

        Raises:
            CheckpointMismatch: the checkpoint does not fit ``abstract_state``.
        """
        return restore.restore(self, chosen, abstract_state)

    def close(self) -> None:
        """Wait for pending work (re-raising its error) and release orbax resources. After a failed save,
        orbax re-raises that save's error at close: it was reported already (CheckpointSaveFailed), so it is
        logged, not raised over it."""
        try:
            self.wait()
        finally:
            self._worker.shutdown()
            try:
                self.manager.close()
            except Exception as err:
                if not self._save_failed:
                    raise
                # its text can hold a whole formatted traceback (seen under load): the first line says it
                self.log.info("orbax's close repeated the failed save's error: %s: %s", type(err).__name__,
                              _first_line(err))


__all__ = ["LATEST_MANIFEST", "CheckpointMismatch", "CheckpointSaveFailed", "Checkpointer"]
