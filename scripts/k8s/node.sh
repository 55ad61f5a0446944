#!/usr/bin/env bash
# The single-node cluster's processes, run by cluster.sh inside the cluster's own network
# namespace and a private mount namespace:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler   (the control plane)
#   containerd + runc, kubelet, kube-proxy (iptables)                (the node)
#   dnsmasq fed by cluster_dns.py                                    (Service names)
# Everything it mounts lives in this mount namespace only, every iptables rule, bridge and
# net.* sysctl in the network namespace only: both vanish when this process tree ends.
# SIGTERM stops the pods, then each component, in reverse order.
#   node.sh DIR BIN IMAGE_STORE   (DIR: the state folder cluster.sh prepared: pki/,
#                                  config/, ...; IMAGE_STORE: containerd's root, kept)
set -euo pipefail
DIR=$1
BIN=$2
IMAGE_STORE=$3
HERE="$(cd "$(dirname "$0")" && pwd)"
LOGS="$DIR/logs"
mkdir -p "$LOGS"
log() { echo "[node $(date +%T)] $*" >&2; }
PIDS=()

start() {  # name cmd...: a component in the background, its log in logs/NAME.log
  local name=$1; shift
  "$@" </dev/null >>"$LOGS/$name.log" 2>&1 &
  PIDS+=("$name:$!")
  log "started $name (pid $!)"
}

stop_one() {  # NAME: SIGTERM, up to 5 s, then SIGKILL
  local entry pid
  for entry in "${PIDS[@]}"; do
    [ "${entry%%:*}" = "$1" ] || continue
    pid=${entry#*:}
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

stop_all() {
  trap - TERM INT
  log "stopping"
  # The kubelet first (it would restart the containers we stop), then the containers
  # while containerd still answers, then the rest in reverse order of start.
  stop_one kubelet
  local ctr=(ctr --address "$DIR/containerd/containerd.sock" -n k8s.io) id only_images=false
  if [ -S "$DIR/containerd/containerd.sock" ]; then
    for id in $("${ctr[@]}" tasks ls -q 2>/dev/null); do "${ctr[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    # The image store outlives this node: its containers (and their writable layers) go,
    # so the next node starts with images only.
    only_images=true
    for id in $("${ctr[@]}" containers ls -q 2>/dev/null); do
      "${ctr[@]}" tasks rm -f "$id" >/dev/null 2>&1 || true
      "${ctr[@]}" containers rm "$id" >/dev/null 2>&1 || only_images=false
    done
  fi
  local i
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do stop_one "${PIDS[$i]%%:*}"; done
  # containerd's shims outlive containerd by design: end them and their containers.
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $DIR/containerd/containerd.sock" 2>/dev/null || true
  if $only_images; then
    # The CRI plugin's folders of the containers just removed (their records are gone).
    rm -rf "$IMAGE_STORE/root/io.containerd.grpc.v1.cri/containers" \
           "$IMAGE_STORE/root/io.containerd.grpc.v1.cri/sandboxes"
    rm -f "$IMAGE_STORE/in-use"
  else
    log "containers left in the image store: the next start empties it"
  fi
  log "stopped"
  exit 0
}
trap stop_all TERM INT

# --- mount namespace: shared inside (the kubelet propagates volume mounts into pods),
# private towards the host; our own folders over the paths the node writes to.
mount --make-rshared /
for pair in "varlog:/var/log" "run-containerd:/run/containerd"; do
  src="$DIR/${pair%%:*}"; dst="${pair#*:}"
  mkdir -p "$src" "$dst"
  mount --bind "$src" "$dst"
done
# The kubelet sets these host-wide kernel settings when they differ from its defaults;
# files holding its values, bound over the entries here, leave the host's as they are.
mkdir -p "$DIR/sysctl"
for kv in "vm/overcommit_memory=1" "kernel/panic=10" "kernel/panic_on_oops=1"; do
  key=${kv%%=*}; f="$DIR/sysctl/${key//\//.}"
  echo "${kv#*=}" > "$f"
  mount --bind "$f" "/proc/sys/$key"
done
ip link set lo up

PKI="$DIR/pki"; CFG="$DIR/config"
start etcd "$BIN/etcd" --name node --data-dir "$DIR/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster node=http://127.0.0.1:2380 --quota-backend-bytes 1073741824 --logger zap

start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers http://127.0.0.1:2379 \
  --bind-address 0.0.0.0 --advertise-address "$NODE_IP" --secure-port 6443 --insecure-port 0 \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --kubelet-client-certificate "$PKI/apiserver-kubelet.crt" --kubelet-client-key "$PKI/apiserver-kubelet.key" \
  --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types Hostname,InternalIP \
  --enable-priority-and-fairness=false --profiling=false --cert-dir "$DIR/apiserver-certs"

for i in $(seq 1 240); do
  curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    https://127.0.0.1:6443/readyz >/dev/null 2>&1 && break
  sleep 0.25
done

start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$CFG/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$CFG/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$CFG/controller-manager.kubeconfig" \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
  --use-service-account-credentials=true --leader-elect=false \
  --bind-address 127.0.0.1 --port 0 --secure-port 10257 --cert-dir "$DIR/cm-certs"

start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig "$CFG/scheduler.kubeconfig" \
  --authentication-kubeconfig "$CFG/scheduler.kubeconfig" \
  --authorization-kubeconfig "$CFG/scheduler.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1 --port 0 --secure-port 10259 \
  --cert-dir "$DIR/scheduler-certs"

start containerd containerd --config "$CFG/containerd.toml"
for i in $(seq 1 100); do [ -S "$DIR/containerd/containerd.sock" ] && break; sleep 0.1; done

start kubelet "$BIN/kubelet" --config "$CFG/kubelet.yaml" \
  --kubeconfig "$CFG/kubelet.kubeconfig" \
  --container-runtime remote \
  --container-runtime-endpoint "unix://$DIR/containerd/containerd.sock" \
  --hostname-override localhost --node-ip "$NODE_IP" --root-dir "$DIR/kubelet" \
  --cert-dir "$DIR/kubelet-certs"

start kube-proxy "$BIN/kube-proxy" --config "$CFG/kube-proxy.yaml"

# Service names: dnsmasq answers from a hosts file that cluster_dns.py keeps in step with
# the API server's Services (what kube-dns/CoreDNS does in a full cluster).
: > "$DIR/dns/hosts"
start dnsmasq dnsmasq --keep-in-foreground --no-resolv --no-hosts --no-poll \
  --addn-hosts "$DIR/dns/hosts" --listen-address "$NODE_IP" --bind-interfaces \
  --port 53 --domain-needed --local=/cluster.local/ --pid-file="$DIR/dns/dnsmasq.pid" --user=root
start cluster-dns python3 "$HERE/cluster_dns.py" --ca "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
  --hosts "$DIR/dns/hosts" --pid-file "$DIR/dns/dnsmasq.pid"

touch "$DIR/node.started"
# Wait for any component to die (then stop the rest: a half cluster helps nobody).
while :; do
  for entry in "${PIDS[@]}"; do
    if ! kill -0 "${entry#*:}" 2>/dev/null; then
      log "${entry%%:*} exited; last lines of its log:"; tail -n 20 "$LOGS/${entry%%:*}.log" >&2 || true
      stop_all
    fi
  done
  sleep 1 &
  wait $! || true
done
