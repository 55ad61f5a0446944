"""Start, watch and stop local service processes.

A `ProcessGroup` owns every process it starts and stops all of them (SIGTERM, then
SIGKILL after a grace period) on exit, on Ctrl-C and when the owner dies, so neither a
test nor `make run` leaves strays behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlfleet.local.forkserver import ForkedProcess, popen
from rlfleet.logs import DUMP_STACKS_SIGNAL
from rlfleet.rpc.health import check

# Ports for local services come from below the kernel's ephemeral range: every outgoing
# connection takes its source port from that range, so a port found free there can be
# taken between the check and the service's bind (seen with two test workers). Processes
# that start services side by side (pytest-xdist workers) each take a block of their own,
# PORT_BLOCK_ENV (0, 1, ...); others pick a block by their pid.
PORT_BLOCK_ENV = "RLFLEET_PORT_BLOCK"
PORT_FLOOR = 20000
PORT_BLOCK_SIZE = 1500
# How long a stopped process gets to drain before SIGKILL: longer than a service's own
# drain grace (ServiceSettings.grace_s, 10 s), so a clean drain is never cut short
STOP_GRACE_S = 30.0
_port_lock = threading.Lock()
_port_cursor: list[int] = []  # the next candidate's offset in this process's block


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port free now, not handed out before by this process (until its block
    wraps), outside the ephemeral range where the machine allows it."""
    blocks = (_ephemeral_floor() - PORT_FLOOR) // PORT_BLOCK_SIZE
    if blocks < 1:  # no room below the ephemeral range: the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    raw = os.environ.get(PORT_BLOCK_ENV, "")
    block = (int(raw) if raw.isdigit() else os.getpid()) % blocks
    base = PORT_FLOOR + block * PORT_BLOCK_SIZE
    with _port_lock:
        if not _port_cursor:  # a child of a test worker shares its block: start elsewhere
            _port_cursor.append(os.getpid() % PORT_BLOCK_SIZE)
        for _ in range(PORT_BLOCK_SIZE):
            port = base + _port_cursor[0]
            _port_cursor[0] = (_port_cursor[0] + 1) % PORT_BLOCK_SIZE
            if _bindable(port):
                return port
    raise RuntimeError(f"no free port in {base}..{base + PORT_BLOCK_SIZE - 1}")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen | ForkedProcess
    log_path: Path
    address: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _signal_group(proc: Proc, signum: int) -> None:
    try:
        os.killpg(proc.popen.pid, signum)
    except ProcessLookupError:
        pass


class ProcessGroup:
    """`wait_scale` multiplies every readiness deadline: a caller on a busy machine (the
    test suite under load) gives its processes longer to come up, not less work."""

    def __init__(self, log_dir: Path, wait_scale: float = 1.0) -> None:
        self.log_dir = Path(log_dir)
        self.wait_scale = wait_scale
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        address: str | None = None,
        cwd: Path | None = None,
    ) -> Proc:
        log_path = self.log_dir / f"{name}.log"
        # a session of its own (forkserver.popen): our Ctrl-C is handled by us, not
        # delivered twice
        with open(log_path, "ab") as log:
            child = popen(argv, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                          cwd=cwd, output=log.fileno())
        proc = Proc(name, child, log_path, address)
        self.procs.append(proc)
        return proc

    def start_service(
        self, name: str, argv: Sequence[str], address: str, *, env: dict[str, str] | None = None,
        timeout_s: float = 120.0, service: str = "",
        ready: Callable[[], bool] | None = None,
    ) -> Proc:
        """Starts a gRPC service and waits until its health check says SERVING."""
        proc = self.start(name, argv, env=env, address=address)
        timeout_s *= self.wait_scale
        deadline = time.monotonic() + timeout_s
        while True:
            if not proc.alive:
                raise RuntimeError(
                    f"{name} exited with code {proc.popen.returncode}:\n{proc.log_tail()}"
                )
            ok = ready() if ready else check(address, service, timeout_s=1.0) == "SERVING"
            if ok:
                return proc
            if time.monotonic() > deadline:
                self.stop(proc)
                raise TimeoutError(f"{name} not ready after {timeout_s}s:\n{proc.log_tail()}")
            time.sleep(0.2)

    def stop(self, proc: Proc, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to the process group; after `grace_s` (times `wait_scale`) a stack dump
        into the process's log (DUMP_STACKS_SIGNAL: where the drain is stuck), then
        SIGKILL. Returns the exit code."""
        if proc.alive:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.popen.wait(grace_s * self.wait_scale)
            except subprocess.TimeoutExpired:
                _signal_group(proc, DUMP_STACKS_SIGNAL)
                time.sleep(1.0)  # signals are asynchronous: let the dump land before the kill
                _signal_group(proc, signal.SIGKILL)
                proc.popen.wait()
        return proc.popen.returncode

    def kill(self, proc: Proc) -> None:
        """SIGKILL, no grace: for fault-injection tests."""
        if proc.alive:
            _signal_group(proc, signal.SIGKILL)
            proc.popen.wait()

    def stop_all(self, grace_s: float = STOP_GRACE_S) -> None:
        for proc in reversed(self.procs):
            self.stop(proc, grace_s)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def rlfleet_argv(*args: str) -> list[str]:
    """`rlfleet ARGS` with the current interpreter (no reliance on PATH)."""
    return [sys.executable, "-m", "rlfleet.cli", *args]


def serve_argv(service: str, config_dir: Path, name: str, settings: dict[str, Any],
               *extra: str) -> list[str]:
    """`rlfleet SERVICE serve --config FILE`, FILE the process's settings written as YAML
    into `config_dir` (named for the process): the services' documented config files,
    not their flags, are what this library speaks; the file stays beside the logs to
    show how each process ran. `extra` flags (a caller's) override the file."""
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / f"{name}.yaml"
    plain = {k: str(v) if isinstance(v, Path) else v for k, v in settings.items()}
    path.write_text(yaml.safe_dump(plain, sort_keys=True))
    return rlfleet_argv(service, "serve", "--config", str(path), *extra)
