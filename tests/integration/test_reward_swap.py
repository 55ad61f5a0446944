"""Swapping the reward service while the fleet plays: the local stack with env and reward
as separate processes (as in the chart), two rollout replicas playing groups without a
pause, and the reward service replaced mid-run by the example reward service written
outside the library (examples/path-efficiency-reward). Every group scored after the swap
carries the new service's name and version, in the trajectories and in the learner's step
record; the env is never touched."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest

from rlfleet.local.stack import start_stack
from rlfleet.rpc import RpcClient
from rlfleet.v1 import common_pb2, rollout_pb2, rollout_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "path-efficiency-reward" / "src"

pytestmark = pytest.mark.slow


def group() -> rollout_pb2.GroupRequest:
    return rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=1_000_000 + uuid.uuid4().int % 1000,
                                 size=7, max_turns=3),
        group_size=2,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_new_tokens=3),
        idempotency_key=uuid.uuid4().hex, context_mode=common_pb2.CONTEXT_FRAME_ONLY)


class Players:
    """One thread per replica, each playing groups back to back; each finished group is
    recorded with the phase it was sent in and the phase it finished in. A group that
    cannot be scored (the reward service is being replaced) fails UNAVAILABLE and is
    played again, as the learner's pool would."""

    def __init__(self, addresses: list[str], token: str | None) -> None:
        self.phase = "before"
        self.groups: list[dict] = []
        self.retried = 0
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._play, args=(a, token), daemon=True)
                         for a in addresses]

    def _play(self, address: str, token: str | None) -> None:
        client = RpcClient(address, token=token, timeout_s=300)
        try:
            while not self._stop.is_set():
                sent = self.phase
                try:
                    trajectories = list(client.stream(rollout_pb2_grpc.RolloutServiceStub,
                                                      "RolloutGroup", group()))
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    with self._lock:
                        self.retried += 1
                    continue
                with self._lock:
                    self.groups.append({"replica": address, "sent": sent,
                                        "finished": self.phase,
                                        "trajectories": trajectories})
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self._errors.append(exc)
        finally:
            client.close()

    def start(self) -> Players:
        for t in self._threads:
            t.start()
        return self

    def wait_for(self, what: str, predicate, timeout_s: float = 600) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert not self._errors, self._errors
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def count(self, **where: str) -> dict[str, int]:
        with self._lock:
            found: dict[str, int] = {}
            for g in self.groups:
                if all(g[k] == v for k, v in where.items()):
                    found[g["replica"]] = found.get(g["replica"], 0) + 1
            return found

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=600)
        assert not self._errors, self._errors


def test_the_reward_service_is_swapped_mid_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    from rlfleet_learner.loop import reward_fields

    stack = start_stack(tmp_path, runs_root=tmp_path / "runs", run="swap",
                        model_dir=tiny_model_dir, replicas=2, reward="task",
                        separate_reward=True, log=lambda *_: None)
    players = None
    try:
        env_pid = stack.env.popen.pid
        assert stack.reward_address != stack.env_address
        addresses = [r.address for r in stack.replicas]
        players = Players(addresses, stack.token).start()
        players.wait_for("a scored group on each replica before the swap",
                         lambda: len(players.count(finished="before")) == 2)

        players.phase = "swapping"

        def example(port: int, metrics_port: int) -> list[str]:
            return [sys.executable, "-m", "path_efficiency_reward", "--port", str(port),
                    "--metrics-port", str(metrics_port)]

        pythonpath = os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")]))
        new = stack.swap_reward(example, name="path-efficiency",
                                env={"PYTHONPATH": pythonpath})
        players.phase = "after"
        assert new.address == stack.reward_address  # same address, new service

        players.wait_for("two groups on each replica sent after the swap",
                         lambda: all(n >= 2 for n in players.count(sent="after").values())
                         and len(players.count(sent="after")) == 2)
        players.stop()
        assert stack.env.alive and stack.env.popen.pid == env_pid  # the env never moved
        # while the address had no reward service, scores waited for the new one: no group
        # failed and had to be played again
        assert players.retried == 0
    finally:
        if players is not None:
            players._stop.set()
        stack.close()

    def scored_by(phase_key: str, phase: str) -> list:
        return [t for g in players.groups if g[phase_key] == phase for t in g["trajectories"]]

    before, after = scored_by("finished", "before"), scored_by("sent", "after")
    assert before and after
    assert {(t.reward_name, t.reward_version) for t in before} == {("task", "1.0.0")}
    assert {(t.reward_name, t.reward_version) for t in after} == {("path-efficiency", "1.0.0")}
    for t in after:
        assert set(t.reward_components) == {"task", "efficiency"}
        assert 0.0 <= t.reward <= 1.0
        assert t.reward == (t.reward_components["efficiency"] if t.solved else 0.0)
    # Both replicas scored through the new service, from their first group after the swap.
    assert {g["replica"] for g in players.groups if g["sent"] == "after"} == set(addresses)

    # The learner's step record names the service that scored the step.
    assert reward_fields(before)["reward_name"] == "task"
    step_after = reward_fields(after)
    assert (step_after["reward_name"], step_after["reward_version"]) == \
        ("path-efficiency", "1.0.0")
    assert step_after["reward_services"] == {"path-efficiency 1.0.0": len(after)}
    swap_step = reward_fields(before[:3] + after[:1])
    assert swap_step["reward_services"] == {"path-efficiency 1.0.0": 1, "task 1.0.0": 3}
