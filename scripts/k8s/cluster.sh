#!/usr/bin/env bash
# A real single-node Kubernetes (1.20, built from Debian's source by build-k8s.sh) on this
# machine, for `make deploy` and the cluster tests: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, a kubelet with containerd and runc, kube-proxy
# (iptables), and Service names through dnsmasq. No Docker and no image registry needed.
#
#   scripts/k8s/cluster.sh up [--dir DIR]      start it; prints the KUBECONFIG path
#   scripts/k8s/cluster.sh load IMAGE...       copy images from our buildah storage into
#                                              the node's containerd (imagePullPolicy Never),
#                                              skipping those it already holds unchanged
#                                              and, of a changed one, the layers it holds
#   scripts/k8s/cluster.sh down [--dir DIR]    stop everything and put the host back
#   scripts/k8s/cluster.sh status [--dir DIR]
#
# The host is left as it was found: the cluster lives in a network namespace of its own
# (its bridge, veth, iptables rules and net.* sysctls go with it), its mounts in a private
# mount namespace, the kubelet's kernel settings are bound over /proc/sys inside that
# namespace only, and `down` removes the cgroups the kubelet made. The host reaches the
# API server at $NODE_IP:6443 over a veth pair.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${RLFLEET_CACHE:-$HOME/.cache/rlfleet}"
cmd="${1:-}"; shift || true
DIR="$CACHE/k8s/cluster"
# The node's images (containerd's root: content, unpacked layers, image records) outlive
# the cluster, so a later `load` skips every image that is already there unchanged. A clean
# stop leaves only images in it (node.sh removes the containers); a store whose node did
# not stop cleanly is emptied at the next `up`. One cluster runs at a time (one netns).
IMAGE_STORE="$CACHE/k8s/node-images"
IMAGES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    -*) echo "cluster.sh: unknown option $1" >&2; exit 2 ;;
    *) IMAGES+=("$1"); shift ;;
  esac
done
NS=rlfleet-k8s
export NODE_IP=10.250.0.2 HOST_IP=10.250.0.1 SERVICE_CIDR=10.96.0.0/16 POD_CIDR=10.88.0.0/16
KUBECONFIG_HOST="$DIR/kubeconfig"
log() { echo "[cluster] $*" >&2; }
running() { [ -f "$DIR/node.pid" ] && kill -0 "$(cat "$DIR/node.pid")" 2>/dev/null; }

deps() {
  local missing=() p
  for p in containerd runc buildah debootstrap dnsmasq-base containernetworking-plugins \
           iptables conntrack openssl curl iproute2 util-linux; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || { log "need root and Debian packages ${missing[*]}"; exit 1; }
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
}

down() {
  if [ -f "$DIR/node.pid" ]; then
    local pid; pid=$(cat "$DIR/node.pid")
    if kill -0 "$pid" 2>/dev/null; then
      log "stopping the node"
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
  fi
  # Whatever still runs in the namespace (a hung component, a container's process).
  if ip netns list 2>/dev/null | grep -qw "$NS"; then
    for pid in $(ip netns pids "$NS" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.5
    ip netns del "$NS" 2>/dev/null || true
  fi
  ip link del rlk8s-host 2>/dev/null || true
  # Every process left in the pods' cgroups (a container restarted at the last moment, in
  # a pod network namespace of its own), then the cgroups the kubelet and runc made
  # (cgroupfs driver: kubepods under each hierarchy).
  local d pids
  for _ in 1 2 3; do
    # (find fails where there are no kubepods cgroups: a cluster already down)
    pids=$(find /sys/fs/cgroup/*/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u || true)
    [ -n "$pids" ] || break
    kill -KILL $pids 2>/dev/null || true
    sleep 0.5
  done
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [ -d "$d" ] || continue
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ -d "$d" ] && log "could not remove $d (processes left in it?)"
  done
  if [ -f "$DIR/created-run-containerd" ]; then rmdir /run/containerd 2>/dev/null || true; fi
  if [ -f "$DIR/created-run-netns" ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null || true
    rmdir /run/netns 2>/dev/null || true
  fi
  if [ -d "$DIR" ]; then
    rm -rf "$CACHE/k8s/cluster-last-logs" && { [ -d "$DIR/logs" ] && cp -r "$DIR/logs" "$CACHE/k8s/cluster-last-logs" || true; }
    rm -rf "$DIR"
  fi
  log "down"
}

mkcert() {  # NAME CN O KIND(client|server|peer) [SAN]: pki/NAME.{key,crt} signed by the CA
  local name=$1 cn=$2 o=$3 kind=$4 san=${5:-}
  local eku=clientAuth
  [ "$kind" = server ] && eku=serverAuth
  [ "$kind" = peer ] && eku=serverAuth,clientAuth
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"; [ -n "$san" ] && echo "subjectAltName=$san"; } > "$PKI/$name.ext"
  local subj="/CN=$cn"; [ -n "$o" ] && subj="/O=$o/CN=$cn"
  openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$PKI/$name.key" -out "$PKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 30 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

kubeconfig() {  # FILE SERVER CERTNAME USER
  local ca; ca=$(base64 -w0 < "$PKI/ca.crt")
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
  - name: rlfleet-local
    cluster: {server: "$2", certificate-authority-data: $ca}
users:
  - name: $4
    user:
      client-certificate-data: $(base64 -w0 < "$PKI/$3.crt")
      client-key-data: $(base64 -w0 < "$PKI/$3.key")
contexts:
  - name: rlfleet-local
    context: {cluster: rlfleet-local, user: $4, namespace: default}
current-context: rlfleet-local
KC
  chmod 600 "$1"
}

write_configs() {
  PKI="$DIR/pki"; local CFG="$DIR/config"
  mkdir -p "$PKI" "$CFG" "$DIR/dns" "$DIR/cni/net.d" "$DIR/cni/ipam" "$DIR/containerd"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=rlfleet-local-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  mkcert apiserver kube-apiserver "" server \
    "IP:$NODE_IP,IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  mkcert admin rlfleet-admin system:masters client
  mkcert apiserver-kubelet kube-apiserver-kubelet-client system:masters client
  mkcert kubelet system:node:localhost system:nodes client
  mkcert kubelet-serving localhost "" server "DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
  mkcert controller-manager system:kube-controller-manager "" client
  mkcert scheduler system:kube-scheduler "" client
  mkcert kube-proxy system:kube-proxy "" client
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 600 "$PKI"/*.key

  kubeconfig "$KUBECONFIG_HOST" "https://$NODE_IP:6443" admin rlfleet-admin
  kubeconfig "$CFG/admin.kubeconfig" https://127.0.0.1:6443 admin rlfleet-admin
  kubeconfig "$CFG/kubelet.kubeconfig" https://127.0.0.1:6443 kubelet system:node:localhost
  kubeconfig "$CFG/controller-manager.kubeconfig" https://127.0.0.1:6443 controller-manager system:kube-controller-manager
  kubeconfig "$CFG/scheduler.kubeconfig" https://127.0.0.1:6443 scheduler system:kube-scheduler
  kubeconfig "$CFG/kube-proxy.kubeconfig" https://127.0.0.1:6443 kube-proxy system:kube-proxy

  : > "$DIR/resolv.conf"   # the pods' upstream search list: none (no network beyond)
  cat > "$CFG/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: 10250
readOnlyPort: 0
cgroupDriver: cgroupfs
failSwapOn: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
oomScoreAdj: 0
resolvConf: $DIR/resolv.conf
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
# A shared CI box: evict only when really out of room, never collect our imported images
# (nothing could pull them back).
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
YAML
  cat > "$CFG/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $CFG/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: localhost
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Pod -> Service -> pod on the same bridge: masquerading sends the reply back through the
# NAT (no br_netfilter needed). conntrack limits are host-wide: left as the host has them.
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
  cat > "$CFG/containerd.toml" <<TOML
version = 2
root = "$IMAGE_STORE/root"
state = "$DIR/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$DIR/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/rlfleet-pause:3.4"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$DIR/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
TOML
  cat > "$DIR/cni/net.d/10-rlfleet.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "rlfleet",
 "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$DIR/cni/ipam",
            "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
}

kubectl_() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_HOST" "$@"; }

up() {
  deps
  BIN=$("$HERE/build-k8s.sh" | tail -1)
  [ -x "$BIN/kubectl" ] || PYTHON=${PYTHON:-python3} "$HERE/install-helm.sh" >/dev/null
  "$(dirname "$HERE")/images/base.sh" >/dev/null   # the pause image (and the base) if missing
  if running && [ -f "$KUBECONFIG_HOST" ]; then echo "$KUBECONFIG_HOST"; return 0; fi
  down 2>/dev/null || true
  if ip netns list 2>/dev/null | grep -qw "$NS"; then
    log "a cluster is already running in network namespace $NS (another --dir?): cluster.sh down --dir <its dir> first"
    exit 1
  fi
  mkdir -p "$DIR"; chmod 700 "$DIR"
  [ -d /run/containerd ] || touch "$DIR/created-run-containerd"
  # `ip netns add` makes /run/netns a mount point of its own, and leaves it there.
  mountpoint -q /run/netns 2>/dev/null || touch "$DIR/created-run-netns"
  if [ -e "$IMAGE_STORE/in-use" ]; then
    log "the node's image store was not closed cleanly: emptied ($IMAGE_STORE)"
    rm -rf "$IMAGE_STORE"
  fi
  mkdir -p "$IMAGE_STORE"; chmod 700 "$IMAGE_STORE"
  touch "$IMAGE_STORE/in-use"   # removed by node.sh once its stop left only images
  write_configs
  ip netns add "$NS"
  ip link add rlk8s-host type veth peer name rlk8s-node
  ip link set rlk8s-node netns "$NS"
  ip addr add "$HOST_IP/24" dev rlk8s-host && ip link set rlk8s-host up
  ip -n "$NS" addr add "$NODE_IP/24" dev rlk8s-node
  ip -n "$NS" link set rlk8s-node up
  ip -n "$NS" link set lo up
  ip -n "$NS" route add default via "$HOST_IP"   # the kubelet wants a default route
  log "starting the node in network namespace $NS (logs: $DIR/logs)"
  setsid nsenter --net="/run/netns/$NS" unshare -m --propagation private -- \
    bash "$HERE/node.sh" "$DIR" "$BIN" "$IMAGE_STORE" </dev/null >>"$DIR/node.log" 2>&1 &
  echo $! > "$DIR/node.pid"
  local t0=$SECONDS
  until kubectl_ get node localhost -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -q True; do
    if ! running; then log "the node stopped; its log:"; tail -n 40 "$DIR/node.log" >&2; down; exit 1; fi
    if (( SECONDS - t0 > 180 )); then log "node not Ready after 180 s"; tail -n 40 "$DIR/node.log" >&2; down; exit 1; fi
    sleep 1
  done
  until kubectl_ get serviceaccount default >/dev/null 2>&1; do
    (( SECONDS - t0 > 240 )) && { log "no default ServiceAccount (controller-manager?)"; down; exit 1; }
    sleep 1
  done
  load localhost/rlfleet-pause:3.4
  log "ready after $((SECONDS - t0)) s: KUBECONFIG=$KUBECONFIG_HOST"
  echo "$KUBECONFIG_HOST"
}

load() {  # IMAGE...: buildah storage -> docker archive -> containerd's k8s.io namespace
  IMAGE_TOOL=buildah; source "$(dirname "$HERE")/images/tool.sh"
  local ctr=(ctr --address "$DIR/containerd/containerd.sock" -n k8s.io) img id how
  for img in "$@"; do
    # An image is labelled with the buildah image ID it was imported from: the same name
    # with the same ID is the same image, already unpacked.
    id=$(buildah_store inspect --type image --format '{{.FromImageID}}' "$img") \
      || { log "no image $img in the buildah storage"; exit 1; }
    if [ -n "$("${ctr[@]}" images ls -q "name==$img,labels.\"rlfleet.io/image-id\"==$id")" ]; then
      log "$img already in the node"
      continue
    fi
    # Only the layers the node lacks cross over (slim_archive.py); should containerd miss
    # one it listed (a collection in between), the full archive goes instead.
    "${ctr[@]}" content ls -q > "$DIR/node-digests"
    if buildah_store push -q "$img" "docker-archive:/dev/stdout:$img" \
         | python3 "$HERE/slim_archive.py" "$img" "$DIR/node-digests" \
         | "${ctr[@]}" images import - >/dev/null; then
      how="its new layers"
    elif buildah_store push -q "$img" "docker-archive:/dev/stdout:$img" \
         | "${ctr[@]}" images import - >/dev/null; then
      how="in full"
    else
      log "could not load $img"; exit 1
    fi
    "${ctr[@]}" images label "$img" "rlfleet.io/image-id=$id" >/dev/null \
      || { log "could not label $img"; exit 1; }
    log "loaded $img ($how)"
  done
}

case "$cmd" in
  up) up ;;
  down) down ;;
  load) running || { log "not running (cluster.sh up)"; exit 1; }; load "${IMAGES[@]}" ;;
  status) if running; then echo "running: KUBECONFIG=$KUBECONFIG_HOST"; else echo "not running"; exit 1; fi ;;
  *) echo "usage: $0 up|down|status|load IMAGE... [--dir DIR]" >&2; exit 2 ;;
esac
