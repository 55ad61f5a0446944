"""The fleet's TLS files: checked before they are used, reloaded when they change.

A service with TLS settings refuses to start, with one line naming the file and the
reason, when a file is missing or does not parse, when the key does not match the
certificate, or when the certificate is expired, not yet valid or not signed by the
fleet's CA: the same checks OpenSSL makes in a handshake, made here in memory (two
`ssl.SSLObject`s talking through memory BIOs), so a bad file is found at start and not
by the first peer that tries to connect. Nothing falls back to plaintext.

Renewed files (cert-manager renewing a certificate, a chart upgrade re-issuing one: the
kubelet swaps the mounted Secret's files in place) are picked up without a restart: a
server asks `ReloadingServerCertificates` on every new connection, which re-reads the
files when their stamp (inode, size, mtime) has changed and they pass the same checks;
a client (`rpc.client.RpcClient`) opens a new channel when its files' stamp changes.
A renewed set that fails the checks is logged and the last good one kept.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

# The environment `rlfleet` commands read their client TLS from: the names the chart sets
# in every pod (and the services' own settings read, as tls_ca, tls_client_ca, ...).
ENV_NAMES = {
    "ca": "RLFLEET_TLS_CA",
    "client_ca": "RLFLEET_TLS_CLIENT_CA",
    "cert": "RLFLEET_TLS_CERT",
    "key": "RLFLEET_TLS_KEY",
}


class TlsFileError(ValueError):
    """A TLS file that cannot be used; the message names the file and the reason."""


def _read(what: str, path: Path) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsFileError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    if not data.strip():
        raise TlsFileError(f"{what} {path}: the file is empty")
    return data


def _reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason, without its source location."""
    text = getattr(exc, "verify_message", None) or exc.reason or str(exc)
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(text)).lower()


def check_ca(path: Path, what: str = "CA bundle") -> bytes:
    """The CA bundle's bytes; TlsFileError unless it holds at least one certificate."""
    data = _read(what, path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        ctx.load_verify_locations(cadata=data.decode("ascii", errors="replace"))
    except (ssl.SSLError, ValueError):
        raise TlsFileError(f"{what} {path}: does not parse as PEM certificates") from None
    if ctx.cert_store_stats().get("x509", 0) == 0:
        raise TlsFileError(f"{what} {path}: holds no certificate")
    return data


def _context(cert: Path, key: Path, side: int) -> ssl.SSLContext:
    cert_pem = _read("certificate", cert)
    _read("key", key)
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cadata=cert_pem.decode("ascii", errors="replace"))
    except (ssl.SSLError, ValueError):
        raise TlsFileError(f"certificate {cert}: does not parse as a PEM certificate") \
            from None
    ctx = ssl.SSLContext(side)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if "mismatch" in _reason(exc):
            raise TlsFileError(f"key {key}: does not match certificate {cert}") from None
        raise TlsFileError(f"key {key}: does not parse as a PEM private key") from None
    return ctx


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """A TLS handshake between the two contexts, in memory; the first side's error."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_side=False)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client's certificate after the client is done
            try:
                s.read(1)
            except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                pass
            return
    raise ssl.SSLError("the handshake did not complete")


def check_pair(cert: Path, key: Path, ca: Path, *, as_server: bool = True,
               as_client: bool = False) -> None:
    """TlsFileError unless `cert` with `key` is a certificate `ca` signed, valid now, for
    the uses asked (a server's, a client's)."""
    ca_pem = check_ca(ca).decode("ascii", errors="replace")
    uses = [u for u, wanted in (("server", as_server), ("client", as_client)) if wanted]
    for use in uses:
        own = _context(cert, key, ssl.PROTOCOL_TLS_SERVER if use == "server"
                       else ssl.PROTOCOL_TLS_CLIENT)
        own.check_hostname = False
        own.verify_mode = ssl.CERT_NONE
        peer = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT if use == "server"
                              else ssl.PROTOCOL_TLS_SERVER)
        peer.check_hostname = False
        peer.verify_mode = ssl.CERT_REQUIRED
        peer.load_verify_locations(cadata=ca_pem)
        if use == "client":  # the verifying server needs a certificate of its own
            peer.load_cert_chain(cert, key)
        try:
            _handshake(own if use == "server" else peer, peer if use == "server" else own)
        except ssl.SSLError as exc:
            reason = _reason(exc)
            if "unable to get local issuer" in reason or "self-signed" in reason \
                    or "self signed" in reason:
                reason = f"not signed by the CA in {ca}"
            raise TlsFileError(f"certificate {cert}: rejected as a {use} certificate: "
                               f"{reason}") from None


@dataclass(frozen=True)
class ServerFiles:
    """A server's TLS files: its certificate and key, and the CA its clients' certificates
    must be signed by (None: any client, no client certificate asked)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def check(self) -> None:
        if self.client_ca is None:
            _context(self.cert, self.key, ssl.PROTOCOL_TLS_SERVER)
            return
        check_pair(self.cert, self.key, self.client_ca, as_server=True)

    def stamp(self) -> tuple:
        return files_stamp(self.cert, self.key, self.client_ca)

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        ca = Path(self.client_ca).read_bytes() if self.client_ca else None
        return grpc.ssl_server_certificate_configuration(
            [(Path(self.key).read_bytes(), Path(self.cert).read_bytes())],
            root_certificates=ca)


def files_stamp(*paths: Path | None) -> tuple:
    """What changes when any of `paths` is replaced or rewritten (the kubelet swaps a
    Secret volume's files through a symlink: the inode changes)."""
    out = []
    for p in paths:
        if p is None:
            out.append(None)
            continue
        try:
            st = os.stat(p)
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append("missing")
    return tuple(out)


class ReloadingServerCertificates:
    """gRPC's certificate configuration fetcher: asked on each new connection, it answers
    a new configuration once the files changed and pass the checks, None otherwise (keep
    the current one)."""

    def __init__(self, files: ServerFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp = files.stamp()
        self.reloads = 0

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = self.files.stamp()
        if stamp == self._stamp:
            return None
        with self._lock:
            if stamp == self._stamp:
                return None
            self._stamp = stamp
            try:
                self.files.check()
                config = self.files.configuration()
            except (TlsFileError, OSError) as exc:
                log.error("renewed TLS files refused, the last good ones stay in use",
                          extra={"reason": str(exc)})
                return None
            self.reloads += 1
            log.info("TLS files reloaded", extra={"cert": str(self.files.cert)})
            return config


def server_credentials(files: ServerFiles) -> grpc.ServerCredentials:
    """Credentials that reload `files` when they change; TlsFileError if they are bad now.
    With a client CA, clients must present a certificate it signed (mTLS)."""
    files.check()
    return grpc.dynamic_ssl_server_credentials(
        files.configuration(), ReloadingServerCertificates(files),
        require_client_authentication=files.client_ca is not None)


def client_credentials(ca: Path, cert: Path | None = None, key: Path | None = None
                       ) -> dict[str, bytes | None]:
    """`grpc.ssl_channel_credentials`' arguments from a client's files; TlsFileError unless
    the CA bundle parses and a certificate, if given, parses and matches its key (whether
    the fleet's CA signed it is the server's to check: the handshake fails)."""
    if (cert is None) != (key is None):
        given, missing = ("certificate", "key") if key is None else ("key", "certificate")
        raise TlsFileError(f"client TLS: a {given} without a {missing} "
                           f"({cert or key}): give both, or neither")
    roots = check_ca(Path(ca))
    if cert is None or key is None:
        return {"root_certificates": roots, "private_key": None, "certificate_chain": None}
    _context(Path(cert), Path(key), ssl.PROTOCOL_TLS_CLIENT)
    return {"root_certificates": roots, "private_key": Path(key).read_bytes(),
            "certificate_chain": Path(cert).read_bytes()}


def is_ip_target(address: str) -> bool:
    """Whether a gRPC target's host is an IP address (a pod address: no certificate of
    the fleet names it)."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") \
        else address
    host = host.removeprefix("ipv4:").removeprefix("ipv6:").strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def client_options_from_env(env: Mapping[str, str] | None = None) -> dict[str, Path] | None:
    """The `tls=` options of `rlfleet.clients` for a command: from the RLFLEET_TLS_*
    variables (`rlfleet.config.ClientTls`'s rule: the fleet's one CA verifies the servers
    when RLFLEET_TLS_CA is not set); None when none is set (plaintext)."""
    from rlfleet.config import ClientTls

    env = os.environ if env is None else env
    given = {field: Path(env[name]) for field, name in ENV_NAMES.items() if env.get(name)}
    return ClientTls(**given).options()
