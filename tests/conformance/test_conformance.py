"""The conformance kit as a pytest module: every check against several implementations,
each started from its CLI as a real process:

- ``task`` and ``format+task``: rlfleet's env/reward service (maze tasks: core + maze
  checks);
- ``env-only`` / ``reward-only``: the same, each role alone;
- ``plugin``: an env/reward service serving only a task from a plugin package
  (``tests/plugins``, through the ``rlfleet.tasks`` entry point) and a reward function from
  the same package (``rlfleet.rewards``): it lists none of rlfleet's tasks, so the core
  checks are all that apply, and they pass;
- ``skyrl``: an env/reward service serving only a multimodal skyrl-gym environment that
  rlfleet did not write (``--skyrl-env``): core checks only, and they pass;
- ``path-efficiency``: the example reward service written outside the library
  (``examples/path-efficiency-reward``), a reward-only service listing the maze tasks.

Run it against any other implementation with `RLFLEET_CONFORMANCE_TARGET=HOST:PORT`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.conformance.checks import TIMEOUT_S, Target, all_checks, checks_for, run_check
from tests.waits import SCALE, scaled

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins" / "site"
EXAMPLE = ROOT / "examples" / "path-efficiency-reward" / "src"
TOKEN = "conformance-token"

EXTERNAL = os.environ.get("RLFLEET_CONFORMANCE_TARGET")
SERVICES = {
    "task": ["--reward", "task"],
    "format+task": ["--reward", "format+task"],
    "env-only": ["--role", "env"],
    "reward-only": ["--role", "reward", "--reward", "format+task"],
    "plugin": ["--tasks", "countdown", "--reward", "turn-count"],
    "skyrl": ["--skyrl-env", "rlfleet_test_plugins.skyrl_picture:rlfleet-test-picture",
              "--tasks", "skyrl:rlfleet-test-picture"],
    "path-efficiency": None,  # the example's own command
}
TARGETS = ["external"] if EXTERNAL else list(SERVICES)


def _pythonpath(*extra: Path) -> str:
    return os.pathsep.join([*map(str, extra), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)


@pytest.fixture(scope="module", params=TARGETS)
def target(request, tmp_path_factory):
    if EXTERNAL:
        t = Target(EXTERNAL, os.environ.get("RLFLEET_AUTH_TOKEN"), scaled(TIMEOUT_S))
        yield t
        t.close()
        return
    from rlfleet.local.procs import ProcessGroup, free_port, rlfleet_argv

    group = ProcessGroup(tmp_path_factory.mktemp("conformance"), wait_scale=SCALE)
    port = free_port()
    args = SERVICES[request.param]
    env = {"RLFLEET_AUTH_TOKEN": TOKEN, "PYTHONPATH": _pythonpath(PLUGINS, EXAMPLE)}
    if args is None:
        argv = [sys.executable, "-m", "path_efficiency_reward", "--port", str(port),
                "--metrics-port", str(free_port())]
    else:
        argv = rlfleet_argv("env", "serve", "--port", str(port), "--metrics-port",
                            str(free_port()), *args)
    group.start_service(request.param, argv, f"127.0.0.1:{port}", env=env)
    t = Target(f"127.0.0.1:{port}", TOKEN, scaled(TIMEOUT_S))
    t.kind = request.param
    yield t
    t.close()
    group.stop_all()


@pytest.mark.parametrize("check", all_checks(), ids=lambda c: c.name)
def test_conformance(target: Target, check) -> None:
    if check.task and check.name not in {c.name for c in checks_for(target)}:
        pytest.skip(f"the target does not list {check.task} for this contract")
    result = run_check(check, target)
    assert result.outcome != "fail", result.detail


def test_which_checks_apply(target: Target) -> None:
    """Task checks run exactly for the rlfleet tasks a service lists."""
    if EXTERNAL:
        pytest.skip("external target")
    names = {c.name for c in checks_for(target)}
    core = {c.name for c in all_checks() if not c.task}
    assert core <= names
    maze_env = {"maze_2d.oracle_solves", "maze_2d.visgym_actions"}
    maze_reward = {"maze_2d.reward_scores", "maze_2d_hard.reward_scores"}
    if target.kind == "plugin":
        assert names == core  # lists none of rlfleet's tasks: the core checks only
        assert target.task_names == ["countdown"]
        assert list(target.info.tasks) == ["countdown"]
    elif target.kind == "skyrl":
        assert names == core
        assert target.task_names == ["skyrl:rlfleet-test-picture"]
    elif target.kind == "env-only":
        assert maze_env <= names and not names & maze_reward
    elif target.kind in ("reward-only", "path-efficiency"):
        assert maze_reward <= names and not names & maze_env
    else:
        assert maze_env | maze_reward <= names


def test_a_service_without_rlfleet_tasks_passes_the_core_checks(target: Target) -> None:
    if EXTERNAL or target.kind not in ("plugin", "skyrl"):
        pytest.skip("the services without rlfleet tasks only")
    results = [run_check(c, target) for c in checks_for(target)]
    assert [r for r in results if r.outcome == "fail"] == []
    assert {r.name for r in results if r.outcome == "pass"} >= {
        "core.open_observation", "core.turns_and_step_after_done", "core.message_sizes",
        "core.batch_all_or_nothing", "core.reward_scores", "core.reward_errors"}


def test_cli_passes_against_both_rewards(start_env, monkeypatch) -> None:
    monkeypatch.setenv("RLFLEET_AUTH_TOKEN", TOKEN)
    for reward in ("task", "format+task"):
        proc = start_env("--reward", reward, name=f"env-{reward}")
        out = subprocess.run(
            [sys.executable, "-m", "rlfleet.cli", "conformance", "--target", proc.address,
             "--timeout", str(scaled(TIMEOUT_S))],
            capture_output=True, text=True, timeout=scaled(300),
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 failed" in out.stdout
        assert "maze_2d.oracle_solves" in out.stdout and "core.message_sizes" in out.stdout


def test_cli_passes_against_the_example_reward_service(procs, monkeypatch) -> None:
    """`rlfleet conformance` against the reward service written outside the library,
    started with its own command: every check that applies passes."""
    from rlfleet.local.procs import free_port

    monkeypatch.setenv("RLFLEET_AUTH_TOKEN", TOKEN)
    port = free_port()
    proc = procs.start_service(
        "path-efficiency", [sys.executable, "-m", "path_efficiency_reward", "--port",
                            str(port), "--metrics-port", str(free_port())],
        f"127.0.0.1:{port}", env={"PYTHONPATH": _pythonpath(EXAMPLE)})
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "conformance", "--target", proc.address,
         "--json", "--timeout", str(scaled(TIMEOUT_S))], capture_output=True, text=True,
        timeout=scaled(300),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    outcomes = {r["name"]: r["outcome"] for r in json.loads(out.stdout)}  # JSON alone
    assert " 0 failed," in out.stderr.strip().splitlines()[-1]  # the summary
    assert "fail" not in outcomes.values(), outcomes
    # the reward contract, core and the maze's scoring, is checked and passes
    for name in ("core.reward_info", "core.reward_scores", "core.reward_errors",
                 "maze_2d.reward_scores", "maze_2d_hard.reward_scores"):
        assert outcomes[name] == "pass", (name, outcomes)
    # a reward-only service: the env's maze checks do not apply to it
    assert "maze_2d.oracle_solves" not in outcomes


def test_cli_against_a_dead_address_fails_fast_with_one_line() -> None:
    from rlfleet.local.procs import free_port

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "conformance", "--target", dead],
        capture_output=True, text=True, timeout=scaled(120),
    )
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"rlfleet conformance: cannot reach {dead}: UNAVAILABLE")


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_cli_refuses_a_deadline_that_is_not_a_positive_number(value: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "conformance", "--target", "127.0.0.1:1",
         "--timeout", value], capture_output=True, text=True, timeout=scaled(120),
    )
    assert out.returncode == 2
    assert "--timeout" in out.stderr and out.stdout == ""


def test_a_target_refuses_a_deadline_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Target("127.0.0.1:1", timeout_s=0)
