#!/usr/bin/env bash
# A local Kubernetes control plane for tests: etcd + kube-apiserver on loopback only, with
# a CA, serving certificate, service-account keys and a bearer token generated here, and a
# kubeconfig written for it. No kubelet, scheduler or controller-manager: objects are
# stored and validated server-side, pods never run. Without a controller-manager nothing
# would remove the pvc-protection finalizer, so that admission plugin is off: deleted
# claims go at once.
#
#   scripts/k8s/apiserver.sh start [--dir DIR] [--namespace NS]   # prints KUBECONFIG path
#   scripts/k8s/apiserver.sh stop  [--dir DIR]
#   scripts/k8s/apiserver.sh status [--dir DIR]
#
# DIR defaults to ${RLFLEET_CACHE:-$HOME/.cache/rlfleet}/k8s/run. The binaries come from
# build-k8s.sh (built once per machine, cached).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${RLFLEET_CACHE:-$HOME/.cache/rlfleet}"
cmd="${1:-}"; shift || true
DIR="$CACHE/k8s/run"
NS=default
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --namespace) NS="$2"; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

log() { echo "[apiserver] $*" >&2; }

running() { [ -f "$DIR/$1.pid" ] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

stop_one() {
  local name=$1 pid
  [ -f "$DIR/$name.pid" ] || return 0
  pid=$(cat "$DIR/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$DIR/$name.pid"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

case "$cmd" in
stop)
  stop_one kube-apiserver
  stop_one etcd
  log "stopped ($DIR)"
  exit 0 ;;
status)
  if running kube-apiserver && running etcd; then echo "running: KUBECONFIG=$DIR/kubeconfig"; exit 0; fi
  echo "not running"; exit 1 ;;
start) ;;
*) echo "usage: $0 start|stop|status [--dir DIR] [--namespace NS]" >&2; exit 2 ;;
esac

if running kube-apiserver && running etcd && [ -f "$DIR/kubeconfig" ]; then
  echo "$DIR/kubeconfig"; exit 0
fi
stop_one kube-apiserver; stop_one etcd

for tool in openssl curl; do
  command -v "$tool" >/dev/null && continue
  [ "$(id -u)" = 0 ] || { log "need $tool (apt-get install $tool)"; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$tool" >&2 \
    || { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$tool" >&2; }
done

BIN=$("$HERE/build-k8s.sh" | tail -1)
mkdir -p "$DIR"
chmod 700 "$DIR"
PKI="$DIR/pki"
mkdir -p "$PKI"

# --- certificates and keys (fresh per start: nothing here outlives the test server)
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=rlfleet-local-ca" \
  -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
cat > "$PKI/server.ext" <<EXT
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1
EXT
openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
  -keyout "$PKI/server.key" -out "$PKI/server.csr" 2>/dev/null
openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
  -days 30 -extfile "$PKI/server.ext" -out "$PKI/server.crt" 2>/dev/null
openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
TOKEN=$(openssl rand -hex 32)
echo "$TOKEN,rlfleet-admin,rlfleet-admin,system:masters" > "$PKI/tokens.csv"
chmod 600 "$PKI"/*.key "$PKI/tokens.csv"

ETCD_PORT=$(free_port); PEER_PORT=$(free_port); API_PORT=$(free_port)
rm -rf "$DIR/etcd-data"

log "etcd on 127.0.0.1:$ETCD_PORT"
setsid "$BIN/etcd" --name rlfleet --data-dir "$DIR/etcd-data" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-cluster "rlfleet=http://127.0.0.1:$PEER_PORT" \
  --quota-backend-bytes 1073741824 --logger zap --log-outputs "$DIR/etcd.log" \
  </dev/null >>"$DIR/etcd.log" 2>&1 &
echo $! > "$DIR/etcd.pid"

log "kube-apiserver on https://127.0.0.1:$API_PORT"
setsid "$BIN/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" --insecure-port 0 \
  --tls-cert-file "$PKI/server.crt" --tls-private-key-file "$PKI/server.key" \
  --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
  --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-cluster-ip-range 10.0.0.0/24 \
  --endpoint-reconciler-type none \
  --disable-admission-plugins StorageObjectInUseProtection \
  --enable-priority-and-fairness=false --profiling=false \
  --cert-dir "$DIR/certs" \
  </dev/null >>"$DIR/kube-apiserver.log" 2>&1 &
echo $! > "$DIR/kube-apiserver.pid"

CA_DATA=$(base64 -w0 < "$PKI/ca.crt")
umask 077
cat > "$DIR/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
  - name: rlfleet-local
    cluster:
      server: https://127.0.0.1:$API_PORT
      certificate-authority-data: $CA_DATA
users:
  - name: rlfleet-admin
    user:
      token: $TOKEN
contexts:
  - name: rlfleet-local
    context:
      cluster: rlfleet-local
      user: rlfleet-admin
      namespace: $NS
current-context: rlfleet-local
KC

for i in $(seq 1 240); do
  if curl -sf --cacert "$PKI/ca.crt" -H "Authorization: Bearer $TOKEN" \
      "https://127.0.0.1:$API_PORT/readyz" >/dev/null 2>&1; then
    log "ready after $((i / 4))s; KUBECONFIG=$DIR/kubeconfig"
    echo "$DIR/kubeconfig"
    exit 0
  fi
  if ! running kube-apiserver || ! running etcd; then break; fi
  sleep 0.25
done
log "the API server did not become ready; last lines of its log:"
tail -n 30 "$DIR/kube-apiserver.log" >&2 || true
tail -n 10 "$DIR/etcd.log" >&2 || true
stop_one kube-apiserver; stop_one etcd
exit 1
