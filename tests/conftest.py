"""Fixtures shared by the test suite: local process groups, a real env service."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlfleet.local.procs import Proc, ProcessGroup, free_port, rlfleet_argv

# Tests never reach a hub: models and tokenizers are built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path / "logs")
    yield group
    group.stop_all(grace_s=5)


@pytest.fixture
def start_env(procs: ProcessGroup) -> Callable[..., Proc]:
    """Starts `rlfleet env serve` as a real process; returns it once SERVING."""

    def start(*extra: str, name: str = "env", env: dict[str, str] | None = None) -> Proc:
        port = free_port()
        argv = rlfleet_argv("env", "serve", "--port", str(port), "--metrics-port",
                            str(free_port()), *extra)
        return procs.start_service(name, argv, f"127.0.0.1:{port}", env=env)

    return start
