"""The env/reward service as a real process: scale, expiry, capacity, shutdown, CLI,
roles, and tasks and reward functions from plugin packages (tests/plugins)."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from rlfleet.local.procs import free_port
from rlfleet.rpc import RpcClient
from rlfleet.v1 import common_pb2, env_pb2, env_pb2_grpc, reward_pb2, reward_pb2_grpc

Env = env_pb2_grpc.EnvServiceStub
Reward = reward_pb2_grpc.RewardServiceStub
PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def plugin_env(*dirs: str) -> dict[str, str]:
    """The environment that "installs" the test plugin packages for a child process."""
    paths = [str(PLUGINS / d) for d in dirs] + [os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def specs(n: int, seed0: int = 1000) -> list[common_pb2.TaskSpec]:
    return [common_pb2.TaskSpec(task="maze_2d", seed=seed0 + i) for i in range(n)]


def test_thousands_of_concurrent_episodes(start_env) -> None:
    proc = start_env()
    client = RpcClient(proc.address, timeout_s=60)
    n_clients, per_client = 8, 250  # 2000 episodes open at once

    def play(k: int) -> int:
        opened = client.call(Env, "Open", env_pb2.OpenRequest(tasks=specs(per_client, k * 1000)))
        ids = [e.episode_id for e in opened.episodes]
        for _ in range(3):
            step = env_pb2.StepRequest(
                actions=[env_pb2.Action(episode_id=i, text="('move', 3)") for i in ids]
            )
            results = client.call(Env, "Step", step).results
            assert [r.episode_id for r in results] == ids
        closed = client.call(Env, "Close", env_pb2.CloseRequest(episode_ids=ids))
        assert not closed.not_found
        return sum(e.state.turns for e in closed.episodes)

    with ThreadPoolExecutor(n_clients) as pool:
        turns = list(pool.map(play, range(n_clients)))
    assert turns == [3 * per_client] * n_clients


def test_idle_episodes_expire(start_env) -> None:
    proc = start_env("--episode-ttl-s", "0.5")
    client = RpcClient(proc.address)
    ep = client.call(Env, "Open", env_pb2.OpenRequest(tasks=specs(1))).episodes[0]
    time.sleep(1.5)
    with pytest.raises(grpc.RpcError) as err:
        client.call(Env, "Step", env_pb2.StepRequest(
            actions=[env_pb2.Action(episode_id=ep.episode_id, text="('move', 0)")]))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_capacity_is_resource_exhausted_and_nothing_is_lost(start_env) -> None:
    proc = start_env("--max-episodes", "10")
    client = RpcClient(proc.address)
    first = client.call(Env, "Open", env_pb2.OpenRequest(tasks=specs(8))).episodes
    with pytest.raises(grpc.RpcError) as err:
        client.call(Env, "Open", env_pb2.OpenRequest(tasks=specs(3)))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # the episodes already open are untouched and the service is still up
    ids = [e.episode_id for e in first]
    closed = client.call(Env, "Close", env_pb2.CloseRequest(episode_ids=ids))
    assert len(closed.episodes) == 8
    assert client.call(Env, "Open", env_pb2.OpenRequest(tasks=specs(10))).episodes


def test_same_seed_same_png_across_processes(start_env) -> None:
    a, b = start_env(name="env-a"), start_env(name="env-b")
    digests = []
    for proc in (a, b):
        reply = RpcClient(proc.address).call(
            Env, "Open", env_pb2.OpenRequest(tasks=specs(3, 40), include_image=True))
        digests.append([hashlib.sha256(e.observation.image.png).hexdigest()
                        for e in reply.episodes])
    assert digests[0] == digests[1]
    assert len(set(digests[0])) == 3


def test_action_format_travels_as_the_enum(start_env) -> None:
    """TaskSpec.format picks the syntax the env reads; UNSPECIFIED is the task's default
    (literal for maze_2d); a number of no ActionFormat is INVALID_ARGUMENT, naming the
    known values, never read as the default."""
    client = RpcClient(start_env().address)
    formats = [common_pb2.ACTION_FORMAT_UNSPECIFIED, common_pb2.ACTION_FORMAT_TAGS,
               common_pb2.ACTION_FORMAT_VISGYM]
    opened = client.call(Env, "Open", env_pb2.OpenRequest(tasks=[
        common_pb2.TaskSpec(task="maze_2d", seed=7, format=f) for f in formats]))
    ids = [e.episode_id for e in opened.episodes]
    assert "<action>" in opened.episodes[1].observation.instruction
    tags = client.call(Env, "Step", env_pb2.StepRequest(actions=[
        env_pb2.Action(episode_id=i, text="<action>stop</action>") for i in ids])).results
    assert [r.parsed for r in tags] == [False, True, False]
    literal = client.call(Env, "Step", env_pb2.StepRequest(actions=[
        env_pb2.Action(episode_id=i, text="('stop', 'stop')") for i in (ids[0], ids[2])]))
    assert [r.parsed for r in literal.results] == [True, True]
    assert "Action executed successfully" in literal.results[1].observation.feedback
    with pytest.raises(grpc.RpcError) as err:
        client.call(Env, "Open", env_pb2.OpenRequest(tasks=[
            common_pb2.TaskSpec(task="maze_2d", seed=7, format=99)]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown action format value 99" in err.value.details()
    assert "visgym (3)" in err.value.details()


def _frame_cache_metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {m[1]: float(m[2]) for m in re.finditer(
        r"^rlfleet_env_frame_cache_(\w+?)(?:_total)? ([0-9.e+-]+)$", text, re.M)}


def test_frames_are_cached_and_not_built_without_images(start_env) -> None:
    metrics_port = free_port()
    proc = start_env("--metrics-port", str(metrics_port))
    client = RpcClient(proc.address)
    # Four episodes on each of two mazes, stepped into a wall and back: few distinct states.
    tasks = [common_pb2.TaskSpec(task="maze_2d", seed=1_000_000 + i // 4) for i in range(8)]

    def play(include_image: bool) -> list[common_pb2.Observation]:
        opened = client.call(Env, "Open", env_pb2.OpenRequest(
            tasks=tasks, include_image=include_image)).episodes
        ids = [e.episode_id for e in opened]
        observations = [e.observation for e in opened]
        for text in ["('move', 0)", "('move', 2)", "('move', 0)", "('move', 2)"]:
            step = client.call(Env, "Step", env_pb2.StepRequest(
                actions=[env_pb2.Action(episode_id=i, text=text) for i in ids],
                include_image=include_image))
            observations += [r.observation for r in step.results]
        client.call(Env, "Close", env_pb2.CloseRequest(episode_ids=ids))
        return observations

    for obs in play(include_image=False):
        assert obs.HasField("image") and obs.image.ByteSize() == 0
    untouched = _frame_cache_metrics(metrics_port)
    assert untouched["hits"] == untouched["misses"] == untouched["entries"] == 0

    observations = play(include_image=True)
    for obs in observations:
        assert obs.image.png.startswith(b"\x89PNG")
        assert obs.image.sha256 == hashlib.sha256(obs.image.png).hexdigest()
    distinct = {obs.image.sha256 for obs in observations}
    used = _frame_cache_metrics(metrics_port)
    assert used["misses"] == len(distinct) < 10  # each distinct state encoded once
    assert used["hits"] == len(observations) - len(distinct)
    assert 0 < used["bytes"] <= used["max_bytes"] <= 64 * 2**20


def test_reward_services_report_name_and_differ(start_env) -> None:
    records = [reward_pb2.EpisodeRecord(task=specs(1)[0], actions=["('move', 0)", "???"])]
    infos = {}
    for reward in ("task", "format+task"):
        proc = start_env("--reward", reward, name=f"env-{reward}")
        reply = RpcClient(proc.address).call(
            reward_pb2_grpc.RewardServiceStub, "Score", reward_pb2.ScoreRequest(episodes=records))
        infos[reward] = (reply.info.name, reply.scores[0])
    assert infos["task"][0] == "task" and infos["task"][1].reward == 0.0
    name, score = infos["format+task"]
    assert name == "format+task"
    assert score.components["format"] == pytest.approx(0.5)
    assert score.reward == pytest.approx(0.1) and not score.solved


def test_sigterm_drains_and_exits_cleanly(start_env, procs) -> None:
    proc = start_env()
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(30) == 0
    assert "draining" in proc.log_path.read_text()


def test_unknown_reward_is_a_clear_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "env", "serve", "--reward", "nope"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode != 0
    assert ("unknown reward 'nope'; registered: ['format+task', 'novelty', 'progress', "
            "'task']") in out.stderr


def _services(address: str) -> set[str]:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        (reply,) = list(stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
    return {s.name for s in reply.list_services_response.service}


def test_roles_serve_one_contract_each(start_env) -> None:
    env = start_env("--role", "env", name="env-only")
    reward = start_env("--role", "reward", "--reward", "format+task", name="reward-only")
    assert "rlfleet.v1.EnvService" in _services(env.address)
    assert "rlfleet.v1.RewardService" not in _services(env.address)
    assert _services(reward.address) >= {"rlfleet.v1.RewardService"}
    assert "rlfleet.v1.EnvService" not in _services(reward.address)
    # An episode played on the env alone is scored by the reward service alone.
    opened = RpcClient(env.address).call(Env, "Open", env_pb2.OpenRequest(tasks=specs(1)))
    ep = opened.episodes[0]
    texts = ["('move', 0)", "hello"]
    for text in texts:
        RpcClient(env.address).call(Env, "Step", env_pb2.StepRequest(
            actions=[env_pb2.Action(episode_id=ep.episode_id, text=text)]))
    scored = RpcClient(reward.address).call(Reward, "Score", reward_pb2.ScoreRequest(
        episodes=[reward_pb2.EpisodeRecord(task=specs(1)[0], actions=texts)]))
    assert scored.info.name == "format+task" and list(scored.info.tasks) == [
        "maze_2d", "maze_2d_hard"]
    assert scored.scores[0].components["format"] == pytest.approx(0.5)
    assert "reward service (format+task 1.0.0) listening" in reward.log_path.read_text()
    assert "env service listening" in env.log_path.read_text()


def test_a_plugin_task_and_reward_are_served_without_editing_rlfleet(start_env) -> None:
    proc = start_env("--reward", "turn-count", name="env-plugins", env=plugin_env("site"))
    client = RpcClient(proc.address)
    tasks = client.call(Env, "ListTasks", env_pb2.ListTasksRequest()).tasks
    assert [t.name for t in tasks] == ["countdown", "maze_2d", "maze_2d_hard"]
    assert tasks[0].description == "count down to zero (a test plugin)"
    spec = common_pb2.TaskSpec(task="countdown", seed=0)  # counts down from 3
    ep = client.call(Env, "Open", env_pb2.OpenRequest(tasks=[spec], include_image=True)
                     ).episodes[0]
    assert ep.observation.text.startswith("Count down from 3")
    assert not ep.observation.image.png  # a text task: no picture
    actions = ["2", "one", "1", "0"]
    for text in actions:
        result = client.call(Env, "Step", env_pb2.StepRequest(
            actions=[env_pb2.Action(episode_id=ep.episode_id, text=text)])).results[0]
    assert result.observation.done and result.state.solved and result.reward == 1.0
    assert result.state.invalid_turns == 1 and result.state.format_ok_turns == 3
    scored = client.call(Reward, "Score", reward_pb2.ScoreRequest(
        episodes=[reward_pb2.EpisodeRecord(task=spec, actions=actions)]))
    assert (scored.info.name, scored.info.version) == ("turn-count", "0.1.0")
    assert scored.scores[0].reward == pytest.approx(1.0 - 0.04) and scored.scores[0].solved


def test_only_the_tasks_asked_for_are_served(start_env) -> None:
    proc = start_env("--role", "env", "--tasks", "countdown", name="env-countdown",
                     env=plugin_env("site"))
    client = RpcClient(proc.address)
    assert [t.name for t in client.call(Env, "ListTasks", env_pb2.ListTasksRequest()).tasks] \
        == ["countdown"]
    with pytest.raises(grpc.RpcError) as err:
        client.call(Env, "Open", env_pb2.OpenRequest(tasks=specs(1)))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_duplicate_plugin_names_refuse_to_start() -> None:
    env = {**os.environ, **plugin_env("site", "duplicates")}
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "env", "serve", "--port", str(free_port())],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert out.returncode != 0
    assert "is defined twice" in out.stderr and "rlfleet-test-duplicates" in out.stderr
    assert "nothing is overwritten" in out.stderr
