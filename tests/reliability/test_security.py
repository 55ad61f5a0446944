"""Item 9: security on the running fleet.

- Shared-token auth on every gRPC service (token from RLFLEET_AUTH_TOKEN or from a file
  named by RLFLEET_AUTH_TOKEN_FILE, as a Kubernetes Secret is mounted): calls without the
  token or with a wrong one are UNAUTHENTICATED on every method; health, reflection and
  metrics stay reachable for probes; the fleet works end to end with the token (replica →
  env, replica → ckpt-sync acknowledgements, pool → replica); no log holds the token.
- Redis with a password (requirepass): services given REDIS_PASSWORD(_FILE) work; a wrong
  password stops ckpt-sync at start with a clear message, fast, without the password.
- Mutual TLS: a service started with --config holding tls_cert / tls_key / tls_client_ca
  refuses clients without a certificate (or with one from another CA) and serves those
  with one.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rlfleet.clients.rollout_pool import RolloutPool
from rlfleet.fleet import AdapterDirectory, connect
from rlfleet.local.procs import ProcessGroup, free_port, rlfleet_argv
from rlfleet.rpc import RpcClient
from rlfleet.rpc.client import open_channel
from rlfleet.rpc.health import check
from rlfleet.v1 import common_pb2, env_pb2, env_pb2_grpc, sync_pb2
from tests.reliability.conftest import (
    METHODS,
    Fleet,
    Sync,
    assert_exactly_once,
    group,
    wait_until,
)

SC = grpc.StatusCode


def _call(channel: grpc.Channel, method: str, request: object) -> SC:
    stub_cls, _, streaming = METHODS[method]
    fn = getattr(stub_cls(channel), method.split("/")[1])
    try:
        if streaming:
            list(fn(request, timeout=60))
        else:
            fn(request, timeout=60)
    except grpc.RpcError as err:
        return err.code()
    return SC.OK


def _request(method: str) -> object:
    if method == "RolloutService/RolloutGroup":
        return group(g=1, turns=1)
    return METHODS[method][1]()


def _reflection_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            list_services="")]), timeout=5)
        return {s.name for r in replies for s in r.list_services_response.service}


@pytest.mark.slow
def test_token_auth_on_every_service_and_redis_password(fleet: Fleet, tmp_path: Path) -> None:
    token = "tok-" + secrets.token_hex(16)
    redis_password = "pw-" + secrets.token_hex(12)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    password_file = tmp_path / "redis-password"
    password_file.write_text(redis_password)
    fleet.start_redis(password=redis_password)
    fleet.redis_url = f"redis://127.0.0.1:{fleet.redis_port}/0"  # services read the env
    env_auth = {"RLFLEET_AUTH_TOKEN": token, "REDIS_PASSWORD": redis_password}
    file_auth = {"RLFLEET_AUTH_TOKEN_FILE": str(token_file),
                 "REDIS_PASSWORD_FILE": str(password_file)}
    fleet.start_env(env=env_auth)
    fleet.start_sync(env=file_auth)
    (replica,) = fleet.start_replicas(["ra"], env=env_auth)
    addresses = {"EnvService": fleet.env.address, "RewardService": fleet.env.address,
                 "RolloutService": replica.address, "SyncService": fleet.sync.address}

    rejected = 0
    for method in sorted(METHODS):
        address = addresses[method.split("/")[0]]
        for who, channel in (("no token", open_channel(address)),
                             ("wrong token", open_channel(address, token="wrong-" + token)),
                             ("right token", open_channel(address, token=token))):
            with channel:
                code = _call(channel, method, _request(method))
            if who == "right token":
                assert code != SC.UNAUTHENTICATED, method
                if method in ("RolloutService/RolloutGroup", "EnvService/ListTasks"):
                    assert code == SC.OK, method  # the replica reached the env with the token
            else:
                assert code == SC.UNAUTHENTICATED, (method, who, code)
                rejected += 1
    assert rejected == 2 * len(METHODS)

    for proc in (fleet.env, fleet.sync, replica):  # probes need no token
        assert check(proc.address or "") == "SERVING"
        with grpc.insecure_channel(proc.address or "") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert "grpc.health.v1.Health" in _reflection_services(proc.address or "")
        port = proc.extra["metrics_port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.status == 200

    # End to end with the token: publish through ckpt-sync, the replica loads the version
    # and acknowledges it (its ckpt-sync client carries the token), the pool plays groups.
    with pytest.raises(grpc.RpcError) as err:
        fleet.publish(1)  # the test's plain client has no token
    assert err.value.code() == SC.UNAUTHENTICATED
    sync = RpcClient(fleet.sync.address or "", token=token)
    sync.call(Sync, "Publish", sync_pb2.PublishRequest(
        adapter=common_pb2.AdapterRef(run=fleet.run, version=1)))
    redis_url = f"redis://:{redis_password}@127.0.0.1:{fleet.redis_port}/0"
    adapters = AdapterDirectory(connect(redis_url))
    wait_until("the replica's acknowledgement", lambda: "ra" in adapters.acks(fleet.run, 1))
    pool = RolloutPool(redis_url=redis_url, run=fleet.run, token=token, stream_timeout_s=120)
    requests = [group(seed=1_000_900 + i, min_version=1) for i in range(2)]
    results = list(pool.run_groups(requests))
    assert_exactly_once(requests, results)
    assert {t.adapter.version for _, ts in results for t in ts} == {1}
    pool.close()

    for log in sorted(fleet.procs.log_dir.glob("*.log")):
        text = log.read_text(errors="replace")
        assert token not in text, f"the auth token is in {log.name}"
        assert redis_password not in text, f"the Redis password is in {log.name}"
    print(f"auth: {rejected} calls without/with a wrong token rejected over "
          f"{len(METHODS)} methods; 0 secrets in {len(list(fleet.procs.log_dir.glob('*.log')))}"
          " logs")


@pytest.mark.parametrize("given", ["wrong", None])
def test_wrong_redis_password_fails_clearly(fleet: Fleet, given: str | None) -> None:
    password = "pw-" + secrets.token_hex(12)
    fleet.start_redis(password=password)
    env = {"REDIS_PASSWORD": f"{given}-{password[::-1]}"} if given else {}
    port = free_port()
    proc = fleet.procs.start("ckptsync-bad", rlfleet_argv(
        "ckptsync", "serve", "--port", str(port), "--metrics-port", str(free_port()),
        "--redis-url", f"redis://127.0.0.1:{fleet.redis_port}/0", "--runs-root",
        str(fleet.root.root)), env=env)
    wait_until("ckpt-sync to exit", lambda: not proc.alive, timeout_s=60)
    assert proc.popen.returncode not in (0, None)
    log = proc.log_path.read_text()
    assert "Redis refused the credentials" in log and "REDIS_PASSWORD" in log, log
    assert "Traceback" not in log
    assert password not in log and password[::-1] not in log


def _tls_files(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1, a client certificate from the same CA and
    one from another CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
                ) -> x509.CertificateBuilder:
        return (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1)))

    def write(stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        (tmp / f"{stem}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
        (tmp / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def ca(stem: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (builder(stem, name(stem), key)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        write(stem, key, cert)
        return key, cert

    def leaf(stem: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
             *usage: x509.ObjectIdentifier) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (builder(stem, ca_cert.subject, key)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
                .add_extension(x509.SubjectAlternativeName([
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        write(stem, key, cert)

    ca_key, ca_cert = ca("ca")
    leaf("server", ca_key, ca_cert, ExtendedKeyUsageOID.SERVER_AUTH)
    leaf("client", ca_key, ca_cert, ExtendedKeyUsageOID.CLIENT_AUTH)
    # a fleet service's certificate: its server's, and its outgoing clients' (mTLS)
    leaf("fleet", ca_key, ca_cert, ExtendedKeyUsageOID.SERVER_AUTH,
         ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue_key, rogue_cert = ca("rogue-ca")
    leaf("rogue", rogue_key, rogue_cert, ExtendedKeyUsageOID.CLIENT_AUTH)
    return {stem: tmp / stem for stem in ("ca", "server", "client", "fleet", "rogue")}


def test_mutual_tls(procs: ProcessGroup, tmp_path: Path) -> None:
    files = _tls_files(tmp_path)
    config = tmp_path / "env.yaml"
    config.write_text(yaml.safe_dump({
        "tls_cert": str(files["server"]) + ".crt", "tls_key": str(files["server"]) + ".key",
        "tls_client_ca": str(files["ca"]) + ".crt"}))
    ca = Path(str(files["ca"]) + ".crt")
    good = {"ca_file": ca, "cert_file": Path(str(files["client"]) + ".crt"),
            "key_file": Path(str(files["client"]) + ".key")}
    clients = {
        "no client certificate": {"ca_file": ca},
        "certificate from another CA": {"ca_file": ca,
                                        "cert_file": Path(str(files["rogue"]) + ".crt"),
                                        "key_file": Path(str(files["rogue"]) + ".key")},
    }
    port = free_port()
    address = f"127.0.0.1:{port}"

    def list_tasks(tls: dict[str, Path] | None) -> SC:
        try:
            RpcClient(address, tls=tls, max_attempts=1, timeout_s=5).call(
                env_pb2_grpc.EnvServiceStub, "ListTasks", env_pb2.ListTasksRequest())
        except grpc.RpcError as err:
            return err.code()
        return SC.OK

    def ready() -> bool:
        return list_tasks(good) == SC.OK

    proc = procs.start_service("env-tls", rlfleet_argv(
        "env", "serve", "--config", str(config), "--port", str(port)), address, ready=ready)
    assert list_tasks(good) == SC.OK
    for who, tls in clients.items():
        assert list_tasks(tls) == SC.UNAVAILABLE, who  # the handshake fails
    assert list_tasks(None) == SC.UNAVAILABLE  # plaintext
    assert check(address) != "SERVING"  # a plaintext probe cannot pass either
    assert proc.alive
    print(f"mTLS: {len(clients) + 1} clients without a valid certificate refused, 1 served")
