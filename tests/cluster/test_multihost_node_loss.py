"""Multi-host training survives losing a node (issue 18, item 4): two processes over
``jax.distributed`` (gloo), each on its own node of the test cluster, an ``s3://`` root and no shared
disk. Each process writes its own shards of every checkpoint to the bucket and process 0 its manifest
last (tidal/train/shards.py); when a node is SIGKILLed the other process exits within a bounded
time, both restart on fresh nodes, each reads its shards of the checkpoint process 0 chose, and
the run's parameters and whole loss curve are bitwise those of an uninterrupted two-host run.
The second loss is a SIGTERM to process 1's node only, as GKE preempts one VM of a slice (issue 37,
item 6): both processes agree to stop at the same step, checkpoint it and exit 75 within the 30 s
grace, and the retry resumes from that step, losing none.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest

from tests.cluster import multihost_scenario as mh
from tests.cluster import scenario as sc
from tests.cluster import train_scenario as ts

pytestmark = pytest.mark.timeout(1800)
STEPS, EVERY = 40, 10  # two losses at seeded steps in 12..29, each resumed from a checkpoint 10 apart
WATCHDOG_S = 60  # no step for this long: a process exits 76 (tidal/train/watchdog.py)
PEER_TIMEOUT_S = 20  # missed heartbeats for this long: a process is gone (TIDAL_TRAIN_PEER_TIMEOUT_S)


def test_two_hosts_lose_a_node_each_time_and_resume_from_the_bucket_bitwise(cluster, slice_root, tmp_path):
    text = ts.train_recipe(tmp_path, steps=STEPS, checkpoint_every=EVERY, name="tiny_mh")
    steps = sc.step_names(text, tmp_path)
    name = next(s[0] for s in steps if s[2] == "train")
    root = slice_root
    ts.upstream(cluster, text, steps, root=root, run_key="mh")
    proc = sc.on_node_argv(cluster, "mh-prep", text, ["python", "-c", sc.PREPARE, name], root=root)
    prepared = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("XCOM")).removeprefix("XCOM"))
    step_uri = prepared["step_uri"]

    reference_uri = f"{root}/reference-run"
    mh.copy_spec(cluster, step_uri, reference_uri)
    ref = mh.run_hosts(cluster, "mh-ref", reference_uri, root, tmp_path, watchdog_s=WATCHDOG_S)
    assert ref.returncodes == [0, 0], ref.describe()
    want = mh.staged_result(cluster, reference_uri)
    assert want["mesh"] == "data=1 fsdp=2 tensor=1" and len(want["curve"]) == STEPS, want["mesh"]

    rng = random.Random(20261203)
    first, second = sorted(rng.sample(range(EVERY + 2, STEPS - 10), 2))
    attempts = [mh.run_hosts(cluster, "mh-a", step_uri, root, tmp_path, lose=1, target=first, watchdog_s=WATCHDOG_S),
                mh.run_hosts(cluster, "mh-b", step_uri, root, tmp_path, lose=1, target=second, how="SIGTERM",
                             watchdog_s=WATCHDOG_S),
                mh.run_hosts(cluster, "mh-c", step_uri, root, tmp_path, watchdog_s=WATCHDOG_S)]
    logs = "\n".join(a.describe() for a in attempts)
    killed, preempted = attempts[0], attempts[1]
    # the other host noticed within the peer timeout and exited with an error, not a hang
    assert killed.survivor_exit_s is not None and killed.survivor_exit_s < PEER_TIMEOUT_S + 15, logs
    assert killed.returncodes[0] not in (0, None), logs
    # one host's SIGTERM: both checkpointed the same step and exited 75 within the grace
    assert preempted.returncodes == [75, 75], logs
    assert preempted.all_exit_s is not None and preempted.all_exit_s < ts.GRACE_S, logs
    stopped = preempted.preempted_at[0]
    assert stopped is not None and preempted.preempted_at == [stopped, stopped] and stopped >= second, logs
    assert attempts[0].resumed_from == [None, None], logs
    for before, after in itertools.pairwise(attempts):
        newest = after.resumed_from[0]  # the newest checkpoint that had reached the bucket
        if before.how == "SIGTERM":
            assert newest == stopped, logs  # no step lost
        else:
            assert newest in ts.resumable(before.counted, 0, before.last_step, EVERY), logs
        assert after.resumed_from == [newest, newest], logs
        # each process read only its own shards of it, straight from the bucket (tidal/train/shards.py)
        assert all(f"read checkpoint {newest} from {step_uri}: this process's shards" in log
                   for log in after.logs), logs
        assert 0 <= before.last_step - newest <= 2 * EVERY, logs
    assert attempts[-1].returncodes == [0, 0] and attempts[-1].last_step == STEPS, logs
    got = mh.staged_result(cluster, step_uri)
    assert got == want, f"the resumed two-host run differs from an uninterrupted one\n{logs}"

    proc = sc.on_node_argv(cluster, "mh-commit", text, ["python", "-c", sc.COMMIT, name, json.dumps(prepared), "mh"],
                           root=root)
    assert "COMMITTED" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
