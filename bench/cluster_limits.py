"""Benchmark: are the test cluster's nodes as unkind as GKE pods? Each answer measured on fresh nodes.

    .venv/bin/python bench/cluster_limits.py

Starts the test cluster (tests/cluster/harness.py) and a Kubernetes control plane with helm/tidal
installed (tests/cluster/kube.py), then, each on fresh nodes (tests/cluster/limits_scenario.py):

* ``oom_killed``: tidal's training pod with a 256Mi memory limit allocates until the kernel kills it; true when
  it exited 137, the test kubelet wrote reason ``OOMKilled`` and the launch task's reading of the pod
  (operators/pod_failures.py) is ``PodOOMKilled``.
* ``evicted``: a pod writes past its ``tmp`` emptyDir's 64Mi ``sizeLimit``; true when the kubelet stand-in
  evicted it (``Failed`` / ``Evicted``) and the launch task reads ``PodEvicted``.
* ``localhost_isolated``: a server on node B bound to every address; true when node A's ``localhost`` and
  ``127.0.0.1`` are refused and node B's name answers.
* ``checkout_readable``: true when a node sees a file the launcher wrote into its working tree.
* ``harness_env_leaked``: true when a pod's container sees a variable of the harness (S3 credentials and
  endpoint, the storage root, the tracking URI) that its pod spec does not declare.
* ``logs_streamed``: true when ``kubectl logs`` (what the KubernetesPodOperator reads) returns the pod's output.

Prints the limits each node kind ran with and

    RESULT oom_killed=true|false evicted=true|false localhost_isolated=true|false checkout_readable=false|true
           harness_env_leaked=false|true logs_streamed=true|false seconds=…

Needs root and PostgreSQL (``make services``) and the Kubernetes tools (``make setup``).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import limits_scenario as ls
from tests.cluster import scenario as sc
from tests.cluster.harness import Cluster
from tests.cluster.kube import KubeServer
from tests.cluster.pod_runner import pod_limits
from tests.deploy import kube_checks as kc
from tests.deploy.chart import chart_copy

HARNESS_ONLY = ("AWS_SECRET_ACCESS_KEY", "TIDAL_S3_ENDPOINT_URL", "TIDAL_STORAGE_ROOT", "MLFLOW_TRACKING_URI")


def main() -> int:
    from operators.pod_failures import PodEvicted, PodOOMKilled, explain

    tmp = sc.bench_workdir("cluster-limits-")
    if tmp is None:
        return 1
    tick = time.monotonic()
    try:
        with Cluster.start(tmp / "cluster") as cluster, KubeServer.start(tmp / "kube", nodes=True) as kube:
            values = kc.install(kube, chart_copy(tmp / "chart"), "values-prod.yaml")
            namespace = values["training"]["namespace"]

            pod, resources = ls.small_pod(namespace, ls.ALLOCATE)
            oom = ls.run_pod(cluster, kube, namespace, tmp, pod, resources)
            reason = oom.pod["status"]["containerStatuses"][0]["state"]["terminated"].get("reason")
            oom_killed = (oom.run.returncode == 137 and reason == "OOMKilled"
                          and isinstance(explain(oom.pod, oom.run.pod), PodOOMKilled))
            print(f"oom pod: exit {oom.run.returncode}, reason {reason}, node limits {pod_limits(pod)}")

            pod, resources = ls.small_pod(namespace, ls.FILL_TMP, memory="1Gi", tmp_size="64Mi")
            ev = ls.run_pod(cluster, kube, namespace, tmp, pod, resources)
            evicted = (ev.pod["status"].get("reason") == "Evicted"
                       and isinstance(explain(ev.pod, ev.run.pod), PodEvicted))
            print(f"eviction pod: exit {ev.run.returncode}, status {ev.pod['status'].get('reason')}: "
                  f"{ev.pod['status'].get('message', '')!r}, node limits {pod_limits(pod)}")

            seen, own = ls.dial_across_nodes(cluster, tmp)
            isolated = (seen[:2] == ["localhost ConnectionRefusedError", "127.0.0.1 ConnectionRefusedError"]
                        and seen[2] == "net-b node-b here" and own == "127.0.0.1 node-b here")
            print(f"node net-a dialing net-b's server: {seen}")

            readable = ls.launcher_file_seen(cluster)

            pod, resources = ls.small_pod(namespace, ls.SHOW_ENV, memory="512Mi")
            declared = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
            shown = ls.run_pod(cluster, kube, namespace, tmp, pod, resources)
            seen_env = {line.split()[1] for line in shown.run.log.splitlines() if line.startswith("ENV ")}
            leaked = sorted(k for k in HARNESS_ONLY if k in seen_env and k not in declared)
            print(f"pod env: declared {sorted(declared)}; harness variables seen: {leaked}")
            logs = kube.kubectl("logs", shown.run.pod, "-n", namespace, check=False)
            streamed = "training output: step 1" in logs.stdout
            print(f"kubectl logs: exit {logs.returncode} {logs.stderr.strip()[:200]!r}")
            print(f"node limits (default node: {cluster.limits_of('any')})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def flag(value: bool) -> str:
        return "true" if value else "false"

    print(f"RESULT oom_killed={flag(oom_killed)} evicted={flag(evicted)} localhost_isolated={flag(isolated)} "
          f"checkout_readable={flag(readable)} harness_env_leaked={flag(bool(leaked))} "
          f"logs_streamed={flag(streamed)} seconds={time.monotonic() - tick:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
