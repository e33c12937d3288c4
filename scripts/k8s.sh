#!/usr/bin/env bash
# A one-node Kubernetes cluster on loopback, for the cluster tests (tests/k8s.rs) and for people.
#   scripts/k8s.sh build       builds the pieces from the Go module proxy into K8S_BIN (default
#                              ~/.cache/media-worker/k8s-<version>/bin): kube-apiserver, etcd,
#                              kubelet, kube-controller-manager, kube-scheduler and kubectl from
#                              the wrapper module scripts/k8s/go.mod (k8s.io/kubernetes with its
#                              staging modules replaced by the release's v0.x), and the pod
#                              sandbox's pause image; prints each one's build time. `scripts/
#                              setup.sh --k8s` runs it, with containerd, runc and the CNI plugins
#                              from Debian.
#   scripts/k8s.sh up [IMAGE...]  etcd, the API server (a CA and certificates made here), the
#                              controller manager, the scheduler, a containerd of its own (state,
#                              root and socket in the cluster's directory) and the kubelet, all
#                              on free loopback ports in a temp directory; waits until the node is
#                              Ready, loads the local Docker IMAGEs into it (as `import`), then
#                              prints K8S_DIR=... and KUBECONFIG=... as its last two lines (and
#                              its start time on stderr); DIR/kubectl is the release's kubectl. No kube-proxy, no DNS, no
#                              pod network: pods run with hostNetwork (the CNI configuration is a
#                              loopback-only one, there so that the runtime reports its network
#                              ready; no pod ever gets an address of its own).
#   scripts/k8s.sh keda DIR NS starts KEDA (its operator and metrics adapter, built by `build`
#                              from scripts/k8s/keda/go.mod) against the cluster, watching the
#                              namespace NS (`up` installs its CRDs), the external metrics API registered
#                              with the aggregation layer (an APIService whose Service is
#                              ExternalName localhost: the API server dials the adapter on
#                              127.0.0.1). `keda-down DIR` stops it and unregisters the API.
#   scripts/k8s.sh down DIR    kills the cluster and its pods, removes DIR.
#   scripts/k8s.sh import DIR IMAGE   loads a local Docker image into the cluster's containerd
#                              (`docker save | ctr -n k8s.io images import`): pods use it with
#                              imagePullPolicy: Never.
#   scripts/k8s.sh ctr DIR ARGS...    ctr against the cluster's containerd (namespace k8s.io).
# With K8S_OWNER_PID set, `up` also takes the cluster down when that process ends. As a nextest
# setup script (NEXTEST_ENV set), `up` names the cluster to the tests in MEDIA_TEST_K8S_DIR and
# MEDIA_TEST_KUBECONFIG, and nextest (its parent) owns it.
# The node runs cgroup v1 with the cgroupfs driver (PID 1 need not be systemd), as root.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=$(sed -n "s/^\tk8s.io\/kubernetes \(v[0-9.]*\).*/\1/p" "$HERE/k8s/go.mod")
BIN=${K8S_BIN:-$HOME/.cache/media-worker/k8s-$VERSION/bin}

PAUSE_IMAGE=docker.io/media-worker-k8s/pause:$VERSION

go_build() { # module dir, name, package, ldflags: into BIN unless there, with its build time
  [ -x "$BIN/$2" ] && return 0
  local start; start=$(date +%s)
  (cd "$1" && go build -trimpath -ldflags "$4" -o "$BIN/$2.tmp" "$3")
  mv "$BIN/$2.tmp" "$BIN/$2"
  echo "k8s.sh: built $2 in $(( $(date +%s) - start )) s"
}

build() {
  mkdir -p "$BIN"
  local minor=${VERSION#v1.}; minor=${minor%%.*}
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  local pkg name
  for pkg in k8s.io/kubernetes/cmd/kube-apiserver go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl; do
    name=${pkg##*/}; [ "$name" = v3 ] && name=etcd
    go_build "$HERE/k8s" "$name" "$pkg" "$ldflags"
  done
  # KEDA, from its own module (its scalers' dependencies must not move the pins above), and its
  # CRDs from the same release.
  local kedadir kversion
  kedadir=$(cd "$HERE/k8s/keda" && go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)
  kversion=$(cd "$HERE/k8s/keda" && go list -m -f '{{.Version}}' github.com/kedacore/keda/v2)
  ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=${kversion#v}"
  go_build "$HERE/k8s/keda" keda-operator github.com/kedacore/keda/v2/cmd/operator "$ldflags"
  go_build "$HERE/k8s/keda" keda-adapter github.com/kedacore/keda/v2/cmd/adapter "$ldflags"
  [ -f "$BIN/keda-crds.yaml" ] || for f in "$kedadir"/config/crd/bases/*.yaml; do echo ---; cat "$f"; done >"$BIN/keda-crds.yaml"
  # The sandbox image: one static binary in a Docker archive (what `ctr images import` reads).
  if [ ! -f "$BIN/pause.tar" ]; then
    local work; work=$(mktemp -d)
    gcc -static -Os -s -o "$work/pause" "$HERE/k8s/pause.c"
    python3 - "$work" "$PAUSE_IMAGE" <<'PY2'
import hashlib, io, json, os, sys, tarfile
work, ref = sys.argv[1], sys.argv[2]
layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w") as t:
    info = t.gettarinfo(os.path.join(work, "pause"), arcname="pause")
    info.uid = info.gid = 0; info.uname = info.gname = ""; info.mtime = 0
    with open(os.path.join(work, "pause"), "rb") as f:
        t.addfile(info, f)
layer = layer.getvalue()
config = json.dumps({"architecture": "amd64", "os": "linux",
    "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}).encode()
with tarfile.open(os.path.join(work, "pause.tar"), "w") as t:
    for name, data in [("layer.tar", layer), ("config.json", config),
        ("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": [ref.removeprefix("docker.io/")], "Layers": ["layer.tar"]}]).encode())]:
        info = tarfile.TarInfo(name); info.size = len(data)
        t.addfile(info, io.BytesIO(data))
PY2
    mv "$work/pause.tar" "$BIN/pause.tar"; rm -rf "$work"
    echo "k8s.sh: built the pause image"
  fi
}

# N distinct free loopback ports below the ephemeral range (as kafka.sh).
free_ports() { # n
  python3 - "$1" <<'PY2'
import random, socket, sys
n = int(sys.argv[1]); held, ports = [], []
while len(ports) < n:
    port = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close(); continue
    held.append(s); ports.append(port)
print(" ".join(map(str, ports)))
PY2
}

start() { # name, command... (its pid in DIR/name.pid, its output in DIR/name.log)
  local name=$1; shift
  (exec "$@") >>"$DIR/$name.log" 2>&1 &
  echo $! >"$DIR/$name.pid"
}

alive() { kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

wait_for() { # what, seconds, command...: until the command succeeds; fails when a piece exits
  local what=$1 secs=$2; shift 2
  local end=$(( $(date +%s) + secs )) p
  until "$@" >/dev/null 2>&1; do
    for p in "$DIR"/*.pid; do
      if ! kill -0 "$(cat "$p")" 2>/dev/null; then
        p=$(basename "$p" .pid); echo "k8s.sh: $p exited while waiting for $what:" >&2
        tail -20 "$DIR/$p.log" >&2; return 1
      fi
    done
    if [ "$(date +%s)" -ge "$end" ]; then echo "k8s.sh: no $what within $secs s" >&2; return 1; fi
    sleep 0.2
  done
}

certs() {
  local pki=$DIR/pki
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj /CN=media-worker-k8s-ca \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  issue() { # name, subject, extensions
    openssl req -new -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" 2>/dev/null \
      | openssl x509 -req -days 7 -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -extfile <(printf '%s\n' "$3") -out "$pki/$1.crt" 2>/dev/null
  }
  issue apiserver /CN=kube-apiserver "subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth"
  # One client identity for the control plane, the kubelet and the tests: a cluster admin.
  issue admin "/O=system:masters/CN=admin" "extendedKeyUsage=clientAuth"
  # The aggregation layer's client (the API server proxying to an extension API server), and
  # KEDA's one identity (its gRPC is mutual TLS; its adapter serves the API server under the
  # name the aggregator checks, <service>.<namespace>.svc).
  issue front-proxy /CN=front-proxy-client "extendedKeyUsage=clientAuth"
  issue keda /CN=keda "subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:keda-metrics-apiserver.keda.svc,DNS:keda-operator.keda.svc
extendedKeyUsage=serverAuth,clientAuth"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

up() {
  for b in kube-apiserver etcd kubelet kube-controller-manager kube-scheduler kubectl pause.tar keda-operator keda-adapter keda-crds.yaml; do
    [ -e "$BIN/$b" ] || { echo "k8s.sh: no $BIN/$b: run scripts/setup.sh --k8s" >&2; exit 1; }
  done
  local t0; t0=$(date +%s.%N)
  DIR=$(mktemp -d "${TMPDIR:-/tmp}/k8s.XXXXXX")
  chmod 755 "$DIR"
  local etcd_port peer_port api_port kubelet_port healthz_port
  read -r etcd_port peer_port api_port kubelet_port healthz_port <<<"$(free_ports 5)"
  certs
  local pki=$DIR/pki server=https://127.0.0.1:$api_port
  cat >"$DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: local
    cluster: { server: "$server", certificate-authority: "$pki/ca.crt" }
users:
  - name: admin
    user: { client-certificate: "$pki/admin.crt", client-key: "$pki/admin.key" }
contexts:
  - name: local
    context: { cluster: local, user: admin }
current-context: local
EOF
  # containerd: its own root, state and socket; runc with cgroupfs; the CNI plugins of Debian.
  mkdir -p "$DIR/containerd" "$DIR/cni"
  cat >"$DIR/cni/10-loopback.conflist" <<'EOF'
{ "cniVersion": "1.0.0", "name": "loopback-only", "plugins": [ { "type": "loopback" } ] }
EOF
  cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$DIR/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No OOM score below containerd's own (0): this machine's root lacks CAP_SYS_RESOURCE, and
  # runc fails a pod sandbox's -998 ("failed to update /proc/self/oom_score_adj: Permission
  # denied", seen as "can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni"
EOF
  start containerd /usr/bin/containerd --config "$DIR/containerd/config.toml"
  start etcd "$BIN/etcd" --name local --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "local=http://127.0.0.1:$peer_port" --log-level warn
  # No endpoint reconciler: the `kubernetes` Service would need a non-loopback address.
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --endpoint-reconciler-type none \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" --service-cluster-ip-range 10.96.0.0/24 \
    --kubelet-client-certificate "$pki/admin.crt" --kubelet-client-key "$pki/admin.key" \
    --kubelet-certificate-authority "" --allow-privileged=true \
    --requestheader-client-ca-file "$pki/ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$pki/front-proxy.crt" --proxy-client-key-file "$pki/front-proxy.key"
  wait_for containerd 30 ctr -a "$DIR/containerd/containerd.sock" version
  ctr -a "$DIR/containerd/containerd.sock" -n k8s.io images import "$BIN/pause.tar" >/dev/null
  ln -s "$BIN/kubectl" "$DIR/kubectl"
  local kubectl=("$BIN/kubectl" --kubeconfig "$DIR/kubeconfig")
  wait_for "the API server" 120 "${kubectl[@]}" get --raw /readyz
  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$DIR/kubeconfig" \
    --authentication-kubeconfig "$DIR/kubeconfig" --authorization-kubeconfig "$DIR/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials=false
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$DIR/kubeconfig" \
    --authentication-kubeconfig "$DIR/kubeconfig" --authorization-kubeconfig "$DIR/kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false
  # The kubelet serves on loopback only, without authentication (the tests read its cAdvisor
  # metrics); pod logs in the cluster's directory. Its node's address is the machine's own (a
  # kubelet refuses a loopback node IP); nothing connects to it: no `kubectl logs`/`exec`.
  mkdir -p "$DIR/kubelet" "$DIR/pod-logs"
  cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: { enabled: true }
  webhook: { enabled: false }
authorization: { mode: AlwaysAllow }
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# Its own OOM score as containerd's pods' (the default -999 needs CAP_SYS_RESOURCE).
oomScoreAdj: 0
containerRuntimeEndpoint: unix://$DIR/containerd/containerd.sock
podLogsDir: $DIR/pod-logs
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
# Volumes measured every 2 s (1 min by default): the eviction manager (every 10 s) sees an
# emptyDir past its sizeLimit within seconds, as a busy production node eventually does.
volumeStatsAggPeriod: 2s
# Node pressure in absolute terms: the machine's disk is shared, and the default 15 % free of
# the image file system tainted the node (disk-pressure) at 14.7 %, with 37 GiB free.
evictionHard:
  memory.available: 200Mi
  nodefs.available: 2Gi
  imagefs.available: 2Gi
  nodefs.inodesFree: 5%
syncFrequency: 10s
fileCheckFrequency: 10s
EOF
  # `--containerd`: where cAdvisor (in the kubelet) finds the runtime that names each container
  # cgroup; without it /metrics/cadvisor has pod-level series only, none per container.
  start kubelet "$BIN/kubelet" --config "$DIR/kubelet.yaml" --kubeconfig "$DIR/kubeconfig" \
    --root-dir "$DIR/kubelet" --hostname-override local --containerd "$DIR/containerd/containerd.sock"
  wait_for "a Ready node" 120 bash -c "'${kubectl[0]}' --kubeconfig '$DIR/kubeconfig' get node local -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  wait_for "the default service account" 60 "${kubectl[@]}" -n default get serviceaccount default
  # KEDA's CRDs, as on a cluster where it is installed (its controller runs only when `keda`
  # starts it: the other tests' ScaledObjects are then objects and nothing more).
  "${kubectl[@]}" apply --server-side -f "$BIN/keda-crds.yaml" >/dev/null
  local image
  for image in "$@"; do import_image "$image"; done
  echo "k8s.sh: cluster up in $(python3 -c "import sys; print(round($(date +%s.%N) - $t0, 1))") s" >&2
  if [ -n "${NEXTEST_ENV:-}" ]; then
    printf 'MEDIA_TEST_K8S_DIR=%s\nMEDIA_TEST_KUBECONFIG=%s\n' "$DIR" "$DIR/kubeconfig" >>"$NEXTEST_ENV"
    K8S_OWNER_PID=${K8S_OWNER_PID:-$PPID}
  fi
  if [ -n "${K8S_OWNER_PID:-}" ]; then
    setsid nohup bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 1; done; [ -d "$2" ] && "$0" down "$2"' \
      "$0" "$K8S_OWNER_PID" "$DIR" >/dev/null 2>&1 &
  fi
  echo "K8S_DIR=$DIR"
  echo "KUBECONFIG=$DIR/kubeconfig"
}

keda() { # the namespace KEDA watches
  local ns=$1 pki=$DIR/pki certs=$DIR/keda-certs kubectl=("$BIN/kubectl" --kubeconfig "$DIR/kubeconfig")
  local grpc_port api_port metrics_port health_port adapter_metrics
  read -r grpc_port api_port metrics_port health_port adapter_metrics <<<"$(free_ports 5)"
  mkdir -p "$certs"
  cp "$pki/ca.crt" "$certs/ca.crt"; cp "$pki/keda.crt" "$certs/tls.crt"; cp "$pki/keda.key" "$certs/tls.key"
  local env=(env KUBECONFIG="$DIR/kubeconfig" WATCH_NAMESPACE="$ns" POD_NAMESPACE=keda KEDA_CLUSTER_OBJECT_NAMESPACE=keda)
  start keda-operator "${env[@]}" "$BIN/keda-operator" --leader-elect=false --cert-dir "$certs" \
    --enable-cert-rotation=false --enable-webhook-patching=false --enable-apiservice-patching=false \
    --metrics-bind-address "127.0.0.1:$metrics_port" --health-probe-bind-address "127.0.0.1:$health_port" \
    --metrics-service-bind-address "127.0.0.1:$grpc_port" --zap-log-level info
  start keda-adapter "${env[@]}" "$BIN/keda-adapter" --secure-port "$api_port" --bind-address 127.0.0.1 \
    --cert-dir "$certs" --tls-cert-file "$certs/tls.crt" --tls-private-key-file "$certs/tls.key" \
    --client-ca-file "$pki/ca.crt" --authentication-kubeconfig "$DIR/kubeconfig" \
    --authorization-kubeconfig "$DIR/kubeconfig" --lister-kubeconfig "$DIR/kubeconfig" \
    --metrics-service-address "localhost:$grpc_port" --port "$adapter_metrics" --zap-log-level info
  "${kubectl[@]}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: { name: keda }
---
apiVersion: v1
kind: Service
metadata: { name: keda-metrics-apiserver, namespace: keda }
spec: { type: ExternalName, externalName: localhost, ports: [ { name: https, port: $api_port } ] }
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: { name: v1beta1.external.metrics.k8s.io }
spec:
  service: { name: keda-metrics-apiserver, namespace: keda, port: $api_port }
  group: external.metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  caBundle: $(base64 -w0 "$pki/ca.crt")
EOF
  wait_for "KEDA's external metrics API" 120 "${kubectl[@]}" get --raw /apis/external.metrics.k8s.io/v1beta1
  echo "k8s.sh: KEDA up, watching $ns (logs: $DIR/keda-operator.log, $DIR/keda-adapter.log)" >&2
}

keda_down() {
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" delete --ignore-not-found apiservice v1beta1.external.metrics.k8s.io >/dev/null || true
  stop_pid "$DIR/keda-adapter.pid"; stop_pid "$DIR/keda-operator.pid"
}

import_image() { # a local Docker image into the cluster's containerd
  "${DOCKER:-/usr/bin/docker}" save "$1" | ctr -a "$DIR/containerd/containerd.sock" -n k8s.io images import - >/dev/null
}

stop_pid() { # pidfile
  [ -f "$1" ] || return 0
  local pid; pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$1"
}

down() {
  local sock=$DIR/containerd/containerd.sock t c p
  stop_pid "$DIR/kubelet.pid"
  # The pods' containers outlive containerd (each has its shim): kill and delete them first.
  if [ -S "$sock" ] && [ -f "$DIR/containerd.pid" ]; then
    for t in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -a "$sock" -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1 || true
    done
    for t in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -a "$sock" -n k8s.io tasks delete -f "$t" >/dev/null 2>&1 || true
    done
    for c in $(ctr -a "$sock" -n k8s.io containers ls -q 2>/dev/null); do
      ctr -a "$sock" -n k8s.io containers delete "$c" >/dev/null 2>&1 || true
    done
  fi
  for p in keda-adapter keda-operator kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do stop_pid "$DIR/$p.pid"; done
  # Shims left (their command line names this cluster's socket): ours, ended by pid.
  for p in $(pgrep -f -- "-address $sock" || true); do kill -KILL "$p" 2>/dev/null || true; done
  findmnt -rn -o TARGET | grep -F "$DIR/" | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$DIR"
  # The pods' cgroups the kubelet made (empty now; one cluster at a time per machine).
  find /sys/fs/cgroup/*/kubepods -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
}

case "${1:-}" in
  build) build ;;
  up) shift; up "$@" ;;
  down) DIR=${2:?usage: k8s.sh down DIR}; down ;;
  keda) DIR=${2:?usage: k8s.sh keda DIR NAMESPACE}; keda "${3:?usage: k8s.sh keda DIR NAMESPACE}" ;;
  keda-down) DIR=${2:?usage: k8s.sh keda-down DIR}; keda_down ;;
  import)
    DIR=${2:?usage: k8s.sh import DIR IMAGE}; import_image "${3:?usage: k8s.sh import DIR IMAGE}"
    ;;
  ctr) DIR=${2:?usage: k8s.sh ctr DIR ARGS...}; shift 2; ctr -a "$DIR/containerd/containerd.sock" -n k8s.io "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
