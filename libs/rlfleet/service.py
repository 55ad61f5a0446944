"""What every service process shares: common settings, flags, and the run loop.

A service defines a settings model (subclass of ServiceSettings) and a function that
builds its servicers; `run_service` does the rest: logging, config from file + env +
flags, the rpc server, SIGTERM handling, and a clean exit code.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from rlfleet.config import load_config, read_secret
from rlfleet.logs import setup_logging
from rlfleet.rpc.server import GrpcServer, Registration, ServerConfig, TlsConfig

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


def run_service(
    name: str,
    settings: ServiceSettings,
    registrations: Sequence[Registration],
    on_stop: Callable[[], None] | None = None,
    on_started: Callable[[GrpcServer], None] | None = None,
) -> int:
    setup_logging(name, settings.log_level)
    server = GrpcServer(name, settings.server_config(), registrations)
    server.install_signal_handlers(on_stop)
    server.start()
    if on_started is not None:
        on_started(server)
    print(f"{name} listening on {server.address}", flush=True)
    server.wait()
    return 0
