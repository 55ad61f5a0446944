"""The public reward API (`rlfleet.reward`) as a user's reward service uses it: the
example package (examples/path-efficiency-reward) run as its own process is a standard
rlfleet service (health, auth, metrics, SIGTERM drain), and the same package, installed,
plugs its reward function into `rlfleet env serve` through the `rlfleet.rewards` entry
point."""

from __future__ import annotations

import os
import signal
import sys
import tomllib
import urllib.request
from pathlib import Path

import grpc
import pytest

from rlfleet.local.procs import free_port, rlfleet_argv
from rlfleet.maze import generate_layout, oracle_texts
from rlfleet.rpc import RpcClient
from rlfleet.rpc.health import check
from rlfleet.v1 import common_pb2, reward_pb2, reward_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "path-efficiency-reward"
TOKEN = "reward-api-token"
Reward = reward_pb2_grpc.RewardServiceStub


def _pythonpath(*dirs: Path) -> str:
    return os.pathsep.join([*map(str, dirs), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)


def _records(seed: int = 4) -> reward_pb2.ScoreRequest:
    solve = oracle_texts(generate_layout(seed, 9))
    spec = common_pb2.TaskSpec(task="maze_2d", seed=seed, max_turns=100)
    return reward_pb2.ScoreRequest(episodes=[
        reward_pb2.EpisodeRecord(task=spec, actions=solve),
        reward_pb2.EpisodeRecord(task=spec, actions=["('move', 7)", "hmm", *solve]),
    ])


def test_the_example_is_a_standard_rlfleet_service(procs) -> None:
    port, metrics_port = free_port(), free_port()
    proc = procs.start_service(
        "path-efficiency",
        [sys.executable, "-m", "path_efficiency_reward", "--port", str(port),
         "--metrics-port", str(metrics_port)],
        f"127.0.0.1:{port}",
        env={"RLFLEET_AUTH_TOKEN": TOKEN, "PYTHONPATH": _pythonpath(EXAMPLE / "src")})
    assert check(proc.address, "rlfleet.v1.RewardService") == "SERVING"
    # the fleet's token is required
    with pytest.raises(grpc.RpcError) as err:
        RpcClient(proc.address).call(Reward, "Info", reward_pb2.RewardInfoRequest())
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    client = RpcClient(proc.address, token=TOKEN)
    reply = client.call(Reward, "Score", _records())
    optimal, detour = reply.scores
    assert (reply.info.name, reply.info.version) == ("path-efficiency", "1.0.0")
    assert list(reply.info.components) == ["task", "efficiency"]
    assert list(reply.info.tasks) == ["maze_2d", "maze_2d_hard"]
    assert optimal.solved and optimal.reward == 1.0
    n = len(oracle_texts(generate_layout(4, 9)))
    assert detour.solved and detour.reward == pytest.approx(n / (n + 2))
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                     timeout=10).read().decode()
    assert 'rlfleet_grpc_requests_total{grpc_code="OK",grpc_method="Score",' \
           'grpc_service="rlfleet.v1.RewardService"}' in metrics
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(30) == 0
    log = proc.log_path.read_text()
    assert "reward service path-efficiency 1.0.0 listening" in log and "draining" in log


def _install_metadata(site: Path) -> None:
    """What `pip install examples/path-efficiency-reward` writes for importlib.metadata:
    a dist-info with the entry points of the package's own pyproject.toml."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    info = site / f"path_efficiency_reward-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    lines = []
    for group, eps in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def test_installed_the_example_plugs_into_rlfleet_env_serve(procs, tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install_metadata(site)
    port = free_port()
    proc = procs.start_service(
        "reward-plugin",
        rlfleet_argv("env", "serve", "--role", "reward", "--reward", "path-efficiency",
                     "--port", str(port), "--metrics-port", str(free_port())),
        f"127.0.0.1:{port}",
        env={"RLFLEET_AUTH_TOKEN": TOKEN,
             "PYTHONPATH": _pythonpath(site, EXAMPLE / "src")})
    reply = RpcClient(proc.address, token=TOKEN).call(Reward, "Score", _records())
    assert reply.info.name == "path-efficiency" and reply.scores[0].reward == 1.0
    assert "reward service (path-efficiency 1.0.0) listening" in proc.log_path.read_text()
