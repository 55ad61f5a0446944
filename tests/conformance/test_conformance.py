"""The conformance kit as a pytest module: every check against both shipped reward
services, each started from the CLI as a real process.

Run it against any other implementation with `RLFLEET_CONFORMANCE_TARGET=HOST:PORT`.
"""

from __future__ import annotations

import os

import pytest

from rlfleet.conformance.checks import CHECKS, Target, run_check

EXTERNAL = os.environ.get("RLFLEET_CONFORMANCE_TARGET")
REWARDS = ["external"] if EXTERNAL else ["task", "format+task"]


@pytest.fixture(scope="module", params=REWARDS)
def target(request, tmp_path_factory):
    if EXTERNAL:
        t = Target(EXTERNAL)
        yield t
        t.close()
        return
    from rlfleet.local.procs import ProcessGroup, free_port, rlfleet_argv

    group = ProcessGroup(tmp_path_factory.mktemp("conformance"))
    port = free_port()
    group.start_service(
        f"env-{request.param}",
        rlfleet_argv("env", "serve", "--port", str(port), "--metrics-port", str(free_port()),
                     "--reward", request.param),
        f"127.0.0.1:{port}",
    )
    t = Target(f"127.0.0.1:{port}")
    yield t
    t.close()
    group.stop_all()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_conformance(target: Target, check) -> None:
    result = run_check(check, target)
    assert result.outcome != "fail", result.detail


def test_cli_passes_against_both_rewards(start_env) -> None:
    import subprocess
    import sys

    for reward in ("task", "format+task"):
        proc = start_env("--reward", reward, name=f"env-{reward}")
        out = subprocess.run(
            [sys.executable, "-m", "rlfleet.cli", "conformance", "--target", proc.address],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 failed" in out.stdout
