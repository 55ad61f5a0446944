"""What every service process shares: common settings, flags, and the run loop.

A service defines a settings model (a ServiceSettings subclass with its own default
ports) and builds its GrpcServer; `settings_or_exit` and `serve_forever` do the rest:
config from file + env + flags, logging, SIGTERM handling, a clean exit code.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, model_validator

from rlfleet.cliargs import add_common_args, assignments
from rlfleet.config import ClientTls, ClosedModel, ConfigError, fleet_token, load_config
from rlfleet.logs import setup_logging
from rlfleet.rpc.server import GrpcServer, ServerConfig, TlsConfig, unbindable
from rlfleet.rpc.tls import TlsFileError

__all__ = ["ServiceSettings", "add_common_args", "load_settings", "serve_forever",
           "settings_or_exit"]

S = TypeVar("S", bound="ServiceSettings")
log = logging.getLogger(__name__)


class ServiceSettings(ClosedModel):
    """Settings every service has; a service subclass sets its own default ports."""

    host: str = Field("127.0.0.1", description="address to bind (0.0.0.0 in pods)")
    port: int = Field(0, ge=0, le=65535, description="gRPC port (0: any free port)")
    metrics_port: int | None = Field(None, ge=0, le=65535,
                                     description="Prometheus port (0: any free port)")
    log_level: str = Field("INFO", description="log level")
    grace_s: float = Field(10.0, ge=0, le=600, description="seconds calls in flight get to "
                           "finish on SIGTERM")
    max_concurrent_rpcs: int = Field(1024, ge=1, description="calls served at once; more "
                                     "answer RESOURCE_EXHAUSTED")
    auth: Literal["token", "none"] = Field(
        "token", description="token: the shared token (RLFLEET_AUTH_TOKEN[_FILE]) is "
        "required, and a service without one refuses to start; none turns auth off, "
        "explicitly (--insecure-no-auth)")
    request_timeout_s: float = Field(
        20.0, gt=0, le=3600, description="how long a call may wait for its request message "
        "after its headers (a client that sends headers and never a body is cut off with "
        "DEADLINE_EXCEEDED after this)")
    max_connection_age_s: float | None = Field(
        None, gt=0, description="clients reconnect after this long (rpc.server.ServerConfig):"
        " services of short calls behind a Kubernetes Service set it, so a swapped service "
        "is reached; none: never")
    tls_cert: Path | None = Field(None, description="the server's certificate (with "
                                  "tls_key), also its clients' certificate; none: plaintext")
    tls_key: Path | None = Field(None, description="the key of tls_cert")
    tls_client_ca: Path | None = Field(None, description="set: clients must present a "
                                       "certificate this CA signed")
    tls_ca: Path | None = Field(
        None, description="the CA that signed the servers this service calls (default "
        "tls_client_ca: one fleet CA)")

    @model_validator(mode="after")
    def _tls_complete(self) -> ServiceSettings:
        # A half-given TLS setting must not leave the server in plaintext.
        given = [n for n in ("tls_cert", "tls_key", "tls_client_ca", "tls_ca") if getattr(self, n)]
        if given and not (self.tls_cert and self.tls_key):
            missing = " and ".join(n for n in ("tls_cert", "tls_key") if not getattr(self, n))
            raise ValueError(f"{', '.join(given)} set without {missing}: TLS needs the "
                             "server's certificate and key (the service never falls back "
                             "to plaintext)")
        return self

    def auth_token(self) -> str | None:
        """The shared token, None where auth is explicitly off; ConfigError otherwise."""
        return fleet_token(self.auth)

    def server_config(self) -> ServerConfig:
        tls = None
        if self.tls_cert and self.tls_key:
            tls = TlsConfig(self.tls_cert, self.tls_key, self.tls_client_ca)
        return ServerConfig(
            port=self.port,
            host=self.host,
            metrics_port=self.metrics_port,
            max_concurrent_rpcs=self.max_concurrent_rpcs,
            auth_token=self.auth_token(),
            tls=tls,
            grace_s=self.grace_s,
            request_timeout_s=self.request_timeout_s,
            max_connection_age_s=self.max_connection_age_s,
        )

    def client_tls(self) -> dict[str, Path] | None:
        """TLS options for this service's outgoing clients (`rlfleet.clients`, tls=...): the same
        files as its server. None when the service runs without TLS."""
        return ClientTls(ca=self.tls_ca, client_ca=self.tls_client_ca, cert=self.tls_cert,
                         key=self.tls_key).options()

def load_settings(model: type[S], args: argparse.Namespace, **extra: object) -> S:
    """Settings from --config, RLFLEET_* env and the flags that were given."""
    flags = assignments(getattr(args, "set_values", []))  # --set, below the named flags
    flags.update({
        k: v
        for k, v in vars(args).items()
        if not k.startswith("_")
        and k not in {"config", "func", "command", "subcommand", "set_values"}
        and v is not None
    })
    flags.update(extra)
    return load_config(model, args.config, overrides=flags)


def settings_or_exit(model: type[S], args: argparse.Namespace, service: str) -> S:
    """Loads settings and sets up logging; a bad configuration exits with its message."""
    try:
        settings = load_settings(model, args)
        token = settings.auth_token()  # an empty or missing token refuses to start here
    except ConfigError as exc:
        raise SystemExit(f"rlfleet {service}: {exc}") from None
    # Bad TLS files refuse now, before a model loads for minutes (one line: file, reason).
    server_tls = settings.server_config().tls if settings.tls_cert else None
    try:
        if server_tls is not None:
            server_tls.files().check()
    except TlsFileError as exc:
        raise SystemExit(f"rlfleet {service}: {exc}") from None
    # A taken port fails now, before a model loads for minutes (the server checks again
    # when it binds: a port can be taken in between).
    for what, port in (("gRPC", settings.port), ("metrics", settings.metrics_port)):
        reason = unbindable(settings.host, port) if port is not None else None
        if reason is not None:
            raise SystemExit(f"rlfleet {service}: cannot listen for {what} on "
                             f"{settings.host}:{port}: {reason}")
    setup_logging(service, settings.log_level)
    if token is None:
        log.warning("auth is off (--insecure-no-auth): any client may call this service")
    return settings


def serve_forever(
    server: GrpcServer,
    banner: str,
    on_stop: Callable[[], None] | None = None,
    until_ready: Callable[[], None] | None = None,
) -> int:
    """Starts `server` and drains it on SIGTERM/SIGINT (after `on_stop`); returns 0.

    With `until_ready`, health stays NOT_SERVING while it runs (probes see the server up
    but not ready), then turns SERVING."""
    server.install_signal_handlers(on_stop)
    server.start(serving=until_ready is None)
    log.info(f"{banner} listening", extra={"address": server.address})
    if until_ready is not None:
        until_ready()
        server.set_serving(True)
        log.info(f"{banner} ready", extra={"address": server.address})
    server.wait()
    return 0
