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
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from rlfleet.config import ConfigError, load_config, read_secret
from rlfleet.logs import setup_logging
from rlfleet.rpc.server import GrpcServer, ServerConfig, TlsConfig

S = TypeVar("S", bound="ServiceSettings")
log = logging.getLogger(__name__)


class ServiceSettings(BaseModel):
    """Settings every service has; a service subclass sets its own default ports."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    metrics_port: int | None = Field(None, ge=0, le=65535)
    log_level: str = "INFO"
    grace_s: float = Field(10.0, ge=0, le=600)
    max_concurrent_rpcs: int = Field(1024, ge=1)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None

    def server_config(self) -> ServerConfig:
        tls = None
        if self.tls_cert and self.tls_key:
            tls = TlsConfig(self.tls_cert, self.tls_key, self.tls_client_ca)
        return ServerConfig(
            port=self.port,
            host=self.host,
            metrics_port=self.metrics_port,
            max_concurrent_rpcs=self.max_concurrent_rpcs,
            auth_token=read_secret("RLFLEET_AUTH_TOKEN"),
            tls=tls,
            grace_s=self.grace_s,
        )


def add_common_args(parser: argparse.ArgumentParser, port: int, metrics_port: int) -> None:
    parser.add_argument("--config", help="YAML settings file (env RLFLEET_<KEY> overrides it)")
    parser.add_argument("--host", help="address to bind (default 127.0.0.1; 0.0.0.0 in pods)")
    parser.add_argument("--port", type=int, default=None, help=f"gRPC port (default {port})")
    parser.add_argument(
        "--metrics-port", type=int, default=None, help=f"Prometheus port (default {metrics_port})"
    )
    parser.add_argument("--log-level", default=None)


def load_settings(model: type[S], args: argparse.Namespace, **extra: object) -> S:
    """Settings from --config, RLFLEET_* env and the flags that were given."""
    flags = {
        k: v
        for k, v in vars(args).items()
        if not k.startswith("_") and k not in {"config", "func", "command", "subcommand"}
    }
    flags.update(extra)
    return load_config(model, args.config, overrides=flags)


def settings_or_exit(model: type[S], args: argparse.Namespace, service: str) -> S:
    """Loads settings and sets up logging; a bad configuration exits with its message."""
    try:
        settings = load_settings(model, args)
    except ConfigError as exc:
        raise SystemExit(f"rlfleet {service}: {exc}") from None
    setup_logging(service, settings.log_level)
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
    print(f"{banner} listening on {server.address}", flush=True)
    if until_ready is not None:
        until_ready()
        server.set_serving(True)
        print(f"{banner} ready", flush=True)
    server.wait()
    return 0
