"""Mutual TLS on loopback, with certificates made in the test (`cryptography`): the fleet's
servers refuse a client without the fleet's certificate in the handshake, clients check the
server's name, bad files refuse to start with one line naming the file, renewed files are
picked up by a running server and a running client, and `rlfleet health` works over mTLS.
Real gRPC, real processes where a start is what is tested."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rlfleet.local.procs import ProcessGroup, free_port, rlfleet_argv
from rlfleet.rpc.client import RpcClient
from rlfleet.rpc.health import check
from rlfleet.rpc.server import GrpcServer, ServerConfig, TlsConfig
from rlfleet.rpc.tls import TlsFileError, client_options_from_env
from rlfleet.v1 import env_pb2, env_pb2_grpc
from tests.waits import scaled, wait_until

SERVER_NAME = "fleet-env"
BOTH = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)


@dataclass
class Ca:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(directory: Path, stem: str) -> Ca:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(stem)).issuer_name(_name(stem))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path = directory / f"{stem}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Ca(key, cert, path)


def make_leaf(directory: Path, stem: str, ca: Ca, names: tuple[str, ...] = (SERVER_NAME,),
              usage: tuple[x509.ObjectIdentifier, ...] = BOTH, valid_days: tuple[int, int]
              = (-1, 30)) -> tuple[Path, Path]:
    """(certificate, key) files of a certificate `ca` signs for the DNS `names`, valid
    from/to the given days from now."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(names[0]))
            .issuer_name(ca.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=valid_days[0]))
            .not_valid_after(now + datetime.timedelta(days=valid_days[1]))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usage)), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]),
                           critical=False)
            .sign(ca.key, hashes.SHA256()))
    crt, pem = directory / f"{stem}.crt", directory / f"{stem}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(_pem_key(key))
    return crt, pem


@dataclass
class Pki:
    dir: Path
    fleet: Ca
    rogue: Ca
    server: tuple[Path, Path]  # the env service's: SANs fleet-env (no IP), both uses
    client: tuple[Path, Path]  # the learner's kind: client use only
    rogue_client: tuple[Path, Path]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    fleet = make_ca(tmp_path, "fleet-ca")
    rogue = make_ca(tmp_path, "rogue-ca")
    return Pki(tmp_path, fleet, rogue,
               server=make_leaf(tmp_path, "env", fleet),
               client=make_leaf(tmp_path, "learner", fleet, ("fleet-learner",),
                                (ExtendedKeyUsageOID.CLIENT_AUTH,)),
               rogue_client=make_leaf(tmp_path, "rogue", rogue, ("fleet-learner",), BOTH))


def serve(cert: Path, key: Path, client_ca: Path) -> GrpcServer:
    return GrpcServer("env-test", ServerConfig(tls=TlsConfig(cert, key, client_ca)), []).start()


def opts(ca: Path, pair: tuple[Path, Path] | None = None, **extra: str) -> dict:
    out: dict = {"ca_file": ca}
    if pair is not None:
        out.update(cert_file=pair[0], key_file=pair[1])
    return {**out, **extra}


def health_rpc(address: str, tls: dict | None) -> grpc.StatusCode | str:
    """SERVING, or the gRPC status code of a refused call (through RpcClient, the
    transport the fleet's clients use)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with RpcClient(address, tls=tls, max_attempts=1, timeout_s=scaled(5)) as client:
            reply = client.call(health_pb2_grpc.HealthStub, "Check",
                                health_pb2.HealthCheckRequest())
    except grpc.RpcError as err:
        return err.code()
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_only_the_fleets_certificates_get_through_and_names_are_checked(pki: Pki) -> None:
    server = serve(*pki.server, pki.fleet.path)
    try:
        ip = server.address  # 127.0.0.1:port: the certificate names fleet-env only
        named = f"localhost:{server.port}"
        good = opts(pki.fleet.path, pki.client, server_name=SERVER_NAME)
        assert health_rpc(ip, good) == "SERVING"
        assert health_rpc(ip, opts(pki.fleet.path, pki.client, ip_server_name=SERVER_NAME)) \
            == "SERVING"
        refused = {
            "no client certificate": (ip, opts(pki.fleet.path, server_name=SERVER_NAME)),
            "a certificate from another CA": (ip, opts(pki.fleet.path, pki.rogue_client,
                                                       server_name=SERVER_NAME)),
            "plaintext": (ip, None),
            # the client checks the server's name: the env's certificate is not the rollout's
            "another server name": (ip, opts(pki.fleet.path, pki.client,
                                             server_name="fleet-rollout")),
            "an IP address no certificate names": (ip, opts(pki.fleet.path, pki.client)),
            "a host name the certificate lacks": (named, opts(pki.fleet.path, pki.client)),
            # the server must be the fleet's too
            "trusting another CA": (ip, opts(pki.rogue.path, pki.rogue_client,
                                             server_name=SERVER_NAME)),
        }
        for who, (target, tls) in refused.items():
            assert health_rpc(target, tls) == grpc.StatusCode.UNAVAILABLE, who
        # ip_server_name applies to IP addresses only: a host name is checked as it is
        assert health_rpc(named, opts(pki.fleet.path, pki.client,
                                      ip_server_name=SERVER_NAME)) == grpc.StatusCode.UNAVAILABLE
        assert check(ip, tls=good) == "SERVING"
        print(f"mTLS: 1 client served, {len(refused) + 1} refused in the handshake")
    finally:
        server.stop(0)


@pytest.mark.parametrize("case", ["missing", "expired", "not yet valid", "other CA",
                                  "key mismatch", "CA unparseable", "cert unparseable",
                                  "key without cert"])
def test_bad_files_refuse_to_start_with_one_line(pki: Pki, procs: ProcessGroup, case: str
                                                 ) -> None:
    d = pki.dir
    cert, key = pki.server
    ca = pki.fleet.path
    junk = d / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    settings: dict[str, Path] = {"tls_cert": cert, "tls_key": key, "tls_client_ca": ca}
    if case == "missing":
        settings["tls_cert"] = d / "nowhere.crt"
        wanted = f"{d / 'nowhere.crt'}: cannot be read (No such file or directory)"
    elif case == "expired":
        settings["tls_cert"], settings["tls_key"] = make_leaf(d, "old", pki.fleet,
                                                              valid_days=(-10, -1))
        wanted = f"{settings['tls_cert']}: rejected as a server certificate: certificate " \
                 "has expired"
    elif case == "not yet valid":
        settings["tls_cert"], settings["tls_key"] = make_leaf(d, "early", pki.fleet,
                                                              valid_days=(2, 10))
        wanted = "certificate is not yet valid"
    elif case == "other CA":
        settings["tls_cert"], settings["tls_key"] = pki.rogue_client
        wanted = f"{pki.rogue_client[0]}: rejected as a server certificate: not signed by " \
                 f"the CA in {ca}"
    elif case == "key mismatch":
        settings["tls_key"] = pki.client[1]
        wanted = f"key {pki.client[1]}: does not match certificate {cert}"
    elif case == "CA unparseable":
        settings["tls_client_ca"] = junk
        wanted = f"CA bundle {junk}: does not parse as PEM certificates"
    elif case == "cert unparseable":
        settings["tls_cert"] = junk
        wanted = f"certificate {junk}: does not parse as a PEM certificate"
    else:
        del settings["tls_cert"]
        wanted = "set without tls_cert"
    config = d / "env.yaml"
    config.write_text(yaml.safe_dump({k: str(v) for k, v in settings.items()}))
    port = free_port()
    proc = procs.start(f"env-{case.replace(' ', '-')}", rlfleet_argv(
        "env", "serve", "--config", str(config), "--port", str(port)),
        env={"RLFLEET_AUTH": "none"})
    wait_until("the service to exit", lambda: not proc.alive, timeout_s=scaled(60))
    log = proc.log_path.read_text()
    assert proc.popen.returncode not in (0, None), log
    lines = [line for line in log.splitlines() if line.strip()]
    assert len(lines) == 1 and wanted in lines[0], log
    assert "Traceback" not in log


def _kubelet_swap(directory: Path, files: dict[str, bytes]) -> None:
    """Replaces the files under `directory` the way the kubelet updates a Secret volume:
    a new timestamped dir, then `..data` swapped to it in one rename; the names are
    symlinks through `..data`."""
    version = directory / f"..{os.urandom(4).hex()}"
    version.mkdir()
    for name, data in files.items():
        (version / name).write_bytes(data)
    link = directory / "..data_tmp"
    link.symlink_to(version.name)
    os.replace(link, directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")


def _bundle(ca: Ca, pair: tuple[Path, Path]) -> dict[str, bytes]:
    return {"ca.crt": ca.path.read_bytes(), "tls.crt": pair[0].read_bytes(),
            "tls.key": pair[1].read_bytes()}


def test_renewed_files_are_picked_up_without_a_restart(pki: Pki, tmp_path: Path) -> None:
    """A CA rotation, the hardest renewal: server and client files swap from the fleet's
    CA to a new one. The running server hands the new certificate to new connections and
    asks clients for the new CA; the running client (one RpcClient, as the learner holds)
    reconnects with its new files and stays served; a renewal that fails the checks is
    refused and the last good files keep serving."""
    new_ca = make_ca(tmp_path, "fleet-ca-2")
    server_dir, client_dir = tmp_path / "server-tls", tmp_path / "client-tls"
    server_dir.mkdir()
    client_dir.mkdir()
    _kubelet_swap(server_dir, _bundle(pki.fleet, pki.server))
    _kubelet_swap(client_dir, _bundle(pki.fleet, pki.client))
    server = serve(server_dir / "tls.crt", server_dir / "tls.key", server_dir / "ca.crt")
    try:
        address = server.address
        running = RpcClient(address, max_attempts=1, timeout_s=scaled(5), tls=opts(
            client_dir / "ca.crt", (client_dir / "tls.crt", client_dir / "tls.key"),
            server_name=SERVER_NAME))
        new_client = make_leaf(tmp_path, "learner-2", new_ca, ("fleet-learner",))
        fresh = opts(new_ca.path, new_client, server_name=SERVER_NAME)

        def status(client: RpcClient) -> object:
            from grpc_health.v1 import health_pb2, health_pb2_grpc
            try:
                return client.call(health_pb2_grpc.HealthStub, "Check",
                                   health_pb2.HealthCheckRequest()).status
            except grpc.RpcError as err:
                return err.code()

        serving = 1  # health_pb2.HealthCheckResponse.SERVING
        assert status(running) == serving
        assert health_rpc(address, fresh) == grpc.StatusCode.UNAVAILABLE  # not yet

        _kubelet_swap(server_dir, _bundle(new_ca, make_leaf(tmp_path, "env-2", new_ca)))
        _kubelet_swap(client_dir, _bundle(new_ca, new_client))
        assert health_rpc(address, fresh) == "SERVING"  # the server reloaded
        assert status(running) == serving  # the client reconnected with its new files
        old = opts(pki.fleet.path, pki.client, server_name=SERVER_NAME)
        assert health_rpc(address, old) == grpc.StatusCode.UNAVAILABLE  # old CA is out

        # a broken renewal (key of another certificate) is refused; the last good serves
        broken = _bundle(new_ca, make_leaf(tmp_path, "env-3", new_ca))
        broken["tls.key"] = pki.server[1].read_bytes()
        _kubelet_swap(server_dir, broken)
        assert health_rpc(address, fresh) == "SERVING"
        running.close()
    finally:
        server.stop(0)


def _health_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLFLEET_TLS_")}
    return subprocess.run([sys.executable, "-m", "rlfleet.cli", "health", *args],
                          env={**base, **env}, capture_output=True, text=True,
                          timeout=scaled(60))


def test_rlfleet_health_over_mtls_from_the_environment_and_flags(pki: Pki) -> None:
    server = serve(*pki.server, pki.fleet.path)
    try:
        pod_env = {"RLFLEET_TLS_CLIENT_CA": str(pki.fleet.path),
                   "RLFLEET_TLS_CERT": str(pki.client[0]),
                   "RLFLEET_TLS_KEY": str(pki.client[1])}
        # a probe: the pod's own files from the environment, the name of its Service
        ok = _health_cli(server.address, "--tls-server-name", SERVER_NAME, env=pod_env)
        assert ok.returncode == 0 and ok.stdout.strip() == "SERVING", ok
        flags = _health_cli(server.address, "--tls-server-name", SERVER_NAME,
                            "--tls-ca", str(pki.fleet.path), "--tls-cert", str(pki.client[0]),
                            "--tls-key", str(pki.client[1]), env={})
        assert flags.returncode == 0, flags
        # without the fleet's certificate: refused, one line
        for env in ({}, {"RLFLEET_TLS_CA": str(pki.fleet.path)},
                    {**pod_env, "RLFLEET_TLS_CERT": str(pki.rogue_client[0]),
                     "RLFLEET_TLS_KEY": str(pki.rogue_client[1])}):
            name = ["--tls-server-name", SERVER_NAME] if env else []  # {}: plaintext
            out = _health_cli(server.address, *name, env=env)
            assert out.returncode == 1 and "UNAVAILABLE" in out.stderr, (env, out)
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        # a bad file: one line naming it
        bad = _health_cli(server.address, env={**pod_env, "RLFLEET_TLS_KEY": str(pki.dir)})
        assert bad.returncode == 1 and str(pki.dir) in bad.stderr, bad
        assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    finally:
        server.stop(0)


def test_client_options_from_the_environment(pki: Pki) -> None:
    assert client_options_from_env({}) is None
    env = {"RLFLEET_TLS_CLIENT_CA": str(pki.fleet.path), "RLFLEET_TLS_CERT": "/c",
           "RLFLEET_TLS_KEY": "/k"}
    assert client_options_from_env(env) == {"ca_file": pki.fleet.path,
                                            "cert_file": Path("/c"), "key_file": Path("/k")}
    # a certificate without a CA never becomes a plaintext call
    with pytest.raises(TlsFileError, match="without a CA"):
        RpcClient("127.0.0.1:1", tls={"cert_file": pki.client[0], "key_file": pki.client[1]}
                  ).channel("127.0.0.1:1")
    with pytest.raises(TlsFileError, match="without a key"):
        RpcClient("127.0.0.1:1", tls={"ca_file": pki.fleet.path, "cert_file": pki.client[0]})


def test_env_service_process_serves_mtls(pki: Pki, procs: ProcessGroup) -> None:
    """`rlfleet env serve` with the chart's environment (RLFLEET_TLS_*): served with the
    fleet's certificate, refused without."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = {"RLFLEET_AUTH": "none", "RLFLEET_TLS_CERT": str(pki.server[0]),
           "RLFLEET_TLS_KEY": str(pki.server[1]), "RLFLEET_TLS_CLIENT_CA": str(pki.fleet.path)}
    good = opts(pki.fleet.path, pki.client, server_name=SERVER_NAME)

    def list_tasks(tls: dict | None) -> object:
        try:
            return len(RpcClient(address, tls=tls, max_attempts=1, timeout_s=scaled(5)).call(
                env_pb2_grpc.EnvServiceStub, "ListTasks", env_pb2.ListTasksRequest()).tasks)
        except grpc.RpcError as err:
            return err.code()

    procs.start_service("env-mtls", rlfleet_argv("env", "serve", "--port", str(port)),
                        address, env=env, ready=lambda: isinstance(list_tasks(good), int))
    assert list_tasks(good) > 0
    assert list_tasks(opts(pki.fleet.path, server_name=SERVER_NAME)) == \
        grpc.StatusCode.UNAVAILABLE
    assert list_tasks(None) == grpc.StatusCode.UNAVAILABLE
