"""One training process per train step at a time, across nodes: a lease in the bucket fences the others.

Why: a train step staged in the bucket (``{root}/.staging/{step_id}/``) is resumed by whichever process
is started on it: a retried pod, a rerun launch, a second JobSet by mistake. Two of them at once both
resume, both train and both upload checkpoints under the same keys with different bytes (issue 43,
item 3), and on one machine the second empties the first's work directory. The step leases of
:mod:`tidal.storage.lease` guard only the in-process runner, so the trainer takes its own:
``{root}/.leases/{name}.train.json``, where ``{name}`` is the staging location's own name (the step id
for the one staging location of a resumable step), created or taken over by compare-and-swap, renewed every
``ttl_s / 4`` seconds by a daemon thread.

* Before anything else (before the work directory is emptied), process 0 of the run acquires it. A
  second process waits up to ``1.5 * ttl_s`` (long enough for a holder killed with its node to expire)
  and then exits with one line naming the holder (:class:`TrainingHeld`, exit code :data:`EXIT_HELD`).
* Before each checkpoint upload, the sidecars and the manifest that make it count, and before the
  finished run is staged, the holder renews the lease by compare-and-swap (:func:`Fence.check`): the
  version token it holds is the fencing token. One that lost the lease (it stalled past ``ttl_s`` and
  another process took over) raises :class:`tidal.storage.lease.LeaseLost` and uploads nothing more.

The remaining window is a stall between that check and the upload's last request, shorter than one
upload; the bucket offers no conditional write across several objects to close it. A multi-process run
holds one lease, in process 0: its peers' shard writes are fenced by process 0's manifest, which alone
makes a checkpoint count.
"""

from __future__ import annotations

import logging

from tidal.settings import current
from tidal.storage import StorageError, StorageSettings, open_storage, staging
from tidal.storage.lease import Lease, LeaseTimeout

EXIT_HELD = 3
SUFFIX = ".train"
log = logging.getLogger("tidal.train")


class TrainingHeld(RuntimeError):
    """Another process holds the training lease of this step (its owner, heartbeat and expiry named)."""


class Fence:
    """The training lease of one staged train step, held by this process.

    Args:
        lease: the acquired lease (:func:`hold`).
    """

    def __init__(self, lease: Lease):
        self.lease = lease

    @property
    def owner(self) -> str:
        """This process's name in the lease (``host:pid:random``)."""
        return self.lease.owner

    def check(self) -> None:
        """Renew the lease by compare-and-swap now; call before every upload that makes something count.

        Raises:
            tidal.storage.lease.LeaseLost: another process took the lease over (this one stalled past
                ``ttl_s``); nothing more may be uploaded.
        """
        self.lease.ensure_held()

    def release(self) -> None:
        """Give the lease up (a rerun on any node may start at once)."""
        self.lease.release()


def hold(location: str, *, ttl_s: float | None = None, wait_s: float | None = None) -> Fence:
    """Acquire the training lease of the train step staged at ``location``.

    Args:
        location: the step's staging URI, ``{root}/.staging/{step_id}/`` (lease under ``{root}/.leases/``),
            or any other step directory in a bucket (lease under its parent's ``.leases/``).
        ttl_s: seconds the lease lives without a heartbeat (default ``TIDAL_TRAIN_LEASE_TTL_S``, 60 s:
            a node lost with its holder delays the retry by at most this; GKE takes longer than that to
            reschedule a pod from a lost node).
        wait_s: longest wait for a live holder (default ``1.5 * ttl_s``, so a dead holder's lease
            always expires within it).

    Raises:
        TrainingHeld: another process held it for all of ``wait_s``; names it.
    """
    name = location.rstrip("/").rsplit("/", 1)[-1]  # {step_id}, or a copy's own name: its own trainer
    try:
        root, step_id = staging.parse_location(location)
    except StorageError:  # a step directory given by hand (a reference run): the lease beside it
        root, step_id = location.rstrip("/").rsplit("/", 1)[0], name
    ttl_s = float(ttl_s if ttl_s is not None else current().train_lease_ttl_s)
    wait_s = 1.5 * ttl_s if wait_s is None else wait_s
    lease = open_storage(root, settings=StorageSettings(lease_ttl_s=ttl_s)).lease(name + SUFFIX)
    try:
        lease.acquire(wait_s=wait_s, done=lambda: False, poll_s=min(2.0, ttl_s / 4))
    except LeaseTimeout:
        current_holder = lease.store.read(lease.step_id)
        record = current_holder[0] if current_holder else {}
        raise TrainingHeld(
            f"step {step_id} is being trained by {record.get('owner')!r} (lease {root}/.leases/{name}{SUFFIX}"
            f".json, heartbeat {record.get('heartbeat_at')}, expires {record.get('expires_at')}); waited "
            f"{wait_s:.0f} s and did not start a second trainer. Stop that one first, or wait until it "
            "finishes") from None
    log.info("training lease of %s held by %s (ttl %.0f s)", step_id, lease.owner, ttl_s)
    return Fence(lease)


__all__ = ["EXIT_HELD", "Fence", "TrainingHeld", "hold"]
