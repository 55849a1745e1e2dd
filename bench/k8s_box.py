"""Benchmark: the GKE path against a real Kubernetes API server and real Helm, on this machine.

    bash .ci/services.sh run -- .venv/bin/python bench/k8s_box.py    # root: the test cluster's namespaces

Starts etcd and kube-apiserver on loopback (tests/cluster/kube.py; the tools from ``make tools``),
installs helm/tidal with the prod values (``helm template`` + ``kubectl apply``, the Airflow chart
replaced by tests/deploy/airflow_standin) and the JobSet CRD, then asks the server:

* ``specs_accepted=N/M``: of the M workloads of the hardware matrix (tests/launch/test_pods.py:
  every TPU type x topology, GPU type x count, CPU; spot and on-demand), N were accepted whole,
  by server-side dry-run create in the training namespace (Pod Security ``restricted`` enforced):
  the Pod or JobSet, and for a JobSet the Job and Pod each replicated job would make;
* ``privileged_rejected``: a privileged variant of the first pod is refused by Pod Security;
* ``rbac_denials_ok``: the Airflow worker and triggerer accounts (server-signed tokens) may do
  everything the training Role grants and nothing of the denial list (secrets, exec, other
  namespaces, nodes, RBAC), and the training pods' own account may do none of it;
* ``e2e_train_committed`` / ``preempted_resumed``: on the share-nothing test cluster
  (tests/cluster/harness.py; root, namespaces, PostgreSQL), a training Pod created through the API
  server onto a simulated Spot node pool is deleted mid-run, its retry resumes from the bucket
  checkpoint on another node, and the step commits (tests/cluster/gke_scenario.py);
* ``jobset_committed``: a two-host JobSet created, watched and deleted by the GKE task group's
  operators (provider operators on the Airflow worker's token), made into a Job and pods by the real
  JobSet and Job controllers, ran both hosts over ``jax.distributed`` and the step committed
  (tests/cluster/jobset_scenario.py); ``jobset_s``: its wall seconds, upstream steps reused;
* ``startup_s``: seconds from starting etcd to the API server's ``/readyz`` ok;
  ``install_s``: seconds to render and apply the chart and the CRD.

Prints one line: ``RESULT apiserver=… helm=… specs_accepted=N/M privileged_rejected=… rbac_denials_ok=…
e2e_train_committed=… preempted_resumed=… jobset_committed=… startup_s=… install_s=… e2e_s=… jobset_s=…``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import gke_scenario, jobset_scenario
from tests.cluster.harness import Cluster
from tests.cluster.kube import KubeServer
from tests.deploy import kube_checks as kc
from tests.deploy.chart import chart_copy
from tests.launch.test_pods import MATRIX


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="k8s-box-") as tmp, \
            KubeServer.start(Path(tmp) / "kube", nodes=True) as kube:
        helm_version = subprocess.run([str(kube.tools["HELM"]), "version", "--short"], check=True,
                                      capture_output=True, text=True).stdout.strip().split("+")[0]
        t0 = time.monotonic()
        values = kc.install(kube, chart_copy(Path(tmp) / "chart"), "values-prod.yaml")
        install_s = time.monotonic() - t0
        training = values["training"]["namespace"]
        accepted, total, refusals = kc.admit_matrix(kube, MATRIX, training)
        for line in refusals.splitlines()[:5]:
            print(f"refused: {line}", file=sys.stderr)
        objects = kc.matrix_objects(MATRIX, training)
        pod = next(obj for key, (_, obj) in objects.items() if key.startswith("pod/"))
        bad_accepted, bad_refusals = kc.dry_run_create(kube, [kc.privileged(pod)])
        privileged_rejected = not bad_accepted and 'violates PodSecurity "restricted' in bad_refusals
        report = kc.rbac_report(kube, values)
        for key, wrong in report.items():
            if wrong:
                print(f"rbac: {key}: {', '.join(wrong)}", file=sys.stderr)
        rbac_ok = all(not wrong for wrong in report.values())
        with Cluster.start(Path(tmp) / "cluster") as cluster:
            root = f"s3://tidal/k8s-box-{int(time.time())}"
            (Path(tmp) / "e2e").mkdir()
            (Path(tmp) / "jobset").mkdir()
            t0 = time.monotonic()
            run = gke_scenario.train_through_kube(cluster, kube, values, Path(tmp) / "e2e", root=root,
                                                  sources=None)
            e2e_s = time.monotonic() - t0
            t0 = time.monotonic()
            jobset = jobset_scenario.train_jobset_through_kube(cluster, kube, values, Path(tmp) / "jobset", root=root,
                                                       sources=None)
            jobset_s = time.monotonic() - t0
        preempted = gke_scenario.preempted_and_resumed(run)
        jobset_ok = jobset.committed and jobset.deleted and jobset_scenario.ran_as_two_hosts(jobset)
        print(f"RESULT apiserver={kube.version()} helm={helm_version} specs_accepted={accepted}/{total} "
              f"privileged_rejected={str(privileged_rejected).lower()} rbac_denials_ok={str(rbac_ok).lower()} "
              f"e2e_train_committed={str(run.committed).lower()} preempted_resumed={str(preempted).lower()} "
              f"jobset_committed={str(jobset_ok).lower()} startup_s={kube.startup_s:.2f} "
              f"install_s={install_s:.2f} e2e_s={e2e_s:.1f} jobset_s={jobset_s:.1f}")


if __name__ == "__main__":
    main()
