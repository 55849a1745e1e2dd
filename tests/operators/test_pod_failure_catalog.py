"""Each cause of a pod's end is its own group in the failure catalog and on the on-call page: the catalog's
fingerprint hashes the exception class, and the launch task raises one class per cause."""

from __future__ import annotations

from operators.pod_failures import EXCEPTIONS, explain, last_logged_peak
from tidal.tracking.failures import build_record


def _raise(exc: BaseException) -> None:
    raise exc


def test_one_fingerprint_per_cause():
    records = []
    for cls in EXCEPTIONS.values():
        try:
            _raise(cls("pod tidal-abc ..."))  # the same place in the code for every cause
        except Exception as err:  # noqa: BLE001 - collecting each
            records.append(build_record(err, task_id="train.launch"))
    assert len({r["fingerprint"] for r in records}) == len(EXCEPTIONS) == 5
    names = {"PodOOMKilled", "PodEvicted", "PodPreempted", "PodNodeLost", "PodFailed"}
    assert {r["exception_type"] for r in records} == names


def test_the_peak_is_the_largest_the_trainer_logged():
    assert last_logged_peak('{"peak_memory_bytes": 5}\n{"loss": 1}\n{"peak_memory_bytes": 3.5}\n[]\n') == 5.0
    assert last_logged_peak("") is None


def test_a_pod_that_succeeded_or_never_ended_adds_nothing_to_the_providers_error():
    ok = {"metadata": {"name": "p"}, "status": {"phase": "Succeeded"}}
    pending = {"metadata": {"name": "p"}, "status": {"phase": "Pending"}}
    assert explain(ok, "p") is None and explain(pending, "p") is None


def test_the_on_call_page_shows_each_pod_cause_with_what_to_change():
    from operators.oncall import render_page
    from tidal.tracking.failures import group_failures

    def pod(status: dict) -> dict:
        return {"metadata": {"name": "tidal-abc"}, "spec": {"nodeName": "gke-spot-1", "containers": [
            {"name": "train", "resources": {"limits": {"memory": "8Gi"}}}]}, "status": status}

    oom = pod({"phase": "Failed", "containerStatuses": [
        {"name": "train", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})
    evicted = pod({"phase": "Failed", "reason": "Evicted", "message": 'Usage of EmptyDir volume "tmp" exceeds '
                                                                      'the limit "10Gi". '})
    records = []
    for i, obj in enumerate([oom, evicted, oom]):
        try:
            _raise(explain(obj, "tidal-abc"))
        except Exception as err:  # noqa: BLE001 - collecting each
            records.append(build_record(err, dag_id="tidal_tiny", task_id="train.launch", time=f"2026-12-06T0{i}"))
    groups = group_failures(records)
    assert {g["exception_type"]: g["count"] for g in groups} == {"PodOOMKilled": 2, "PodEvicted": 1}
    base = {"recipe": "tiny", "dag_id": "tidal_tiny", "path": "/r/tiny.yaml", "schedule": None,
            "recipe_hash": "0" * 64, "steps": [], "failing_gates": [], "checkpoint": None, "downstream": None,
            "mlflow": {"uri": "sqlite:///x", "link": None}}
    page = render_page([{**base, "failures": groups}], {})
    assert "<td>PodOOMKilled</td>" in page and "<td>PodEvicted</td>" in page
    assert "at its memory limit 8Gi (the trainer logged no memory before it was killed): raise train.resources." in page
    assert "Evicted by the kubelet: Usage of EmptyDir volume &quot;tmp&quot; exceeds the limit" in page
