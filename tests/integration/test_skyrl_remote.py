"""SkyRL and rlfleet both ways: SkyRL's env API driving a real env service over gRPC, and
SkyRL's own environments (and one registered by a package with `skyrl_gym.register`)
served by rlfleet's env service and played by a real rollout replica."""

from __future__ import annotations

import json
import os
from pathlib import Path

import skyrl_gym

from rlfleet.maze.actions import ActionFormat, format_action
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.oracle import oracle_actions
from rlfleet.rpc import RpcClient
from rlfleet.skyrl import remote_env
from rlfleet.v1 import (
    common_pb2,
    env_pb2,
    env_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)


def test_skyrl_drives_remote_env_to_a_solve(start_env) -> None:
    proc = start_env()
    remote_env.register()
    remote_env.register()  # idempotent
    env = skyrl_gym.make("rlfleet-remote-maze", env_config={"address": proc.address},
                         extras={"seed": 9})
    conversation, info = env.init([{"role": "system", "content": "solve mazes"}])
    content = conversation[-1]["content"]
    assert content[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert info["episode_id"]
    out = env.step("not an action")
    assert not out["done"] and out["metadata"]["parsed"] is False
    texts = [format_action(a, ActionFormat.LITERAL) for a in oracle_actions(
        generate_layout(9, 9))]
    for text in texts:
        out = env.step(text)
    assert out["done"] and out["reward"] == 1.0 and env.get_metrics()["solved"] == 1.0


# -- the other direction: SkyRL's environments served by rlfleet's env service ----------

PLUGINS = Path(__file__).resolve().parents[1] / "plugins" / "site"
PICTURE = "rlfleet_test_plugins.skyrl_picture:rlfleet-test-picture"


def _step(client: RpcClient, episode_id: str, text: str) -> env_pb2.StepResult:
    return client.call(env_pb2_grpc.EnvServiceStub, "Step", env_pb2.StepRequest(
        actions=[env_pb2.Action(episode_id=episode_id, text=text)], include_image=True)
    ).results[0]


def test_skyrls_own_gsm8k_env_is_served_and_scored(start_env, tmp_path: Path) -> None:
    """skyrl-gym's registered `gsm8k_multi_turn` (text, multi-turn, per-turn rewards) with a
    dataset of SkyRL rows; the seed picks the row."""
    rows = [{"prompt": [{"role": "system", "content": "You are good at math."},
                        {"role": "user", "content": f"What is {a} + {b}?"}],
             "env_class": "gsm8k_multi_turn",
             "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
             "extra_info": {"max_turns": 3}} for a, b in ((40, 2), (1, 1))]
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = start_env("--skyrl-env", f"gsm8k_multi_turn={data}", name="env-skyrl")
    client = RpcClient(proc.address)
    tasks = {t.name: t for t in client.call(env_pb2_grpc.EnvServiceStub, "ListTasks",
                                            env_pb2.ListTasksRequest()).tasks}
    assert "skyrl:gsm8k_multi_turn" in tasks and "maze_2d" in tasks
    assert tasks["skyrl:gsm8k_multi_turn"].description.endswith("2 dataset rows")
    spec = common_pb2.TaskSpec(task="skyrl:gsm8k_multi_turn", seed=2)  # row 0: 40 + 2
    ep = client.call(env_pb2_grpc.EnvServiceStub, "Open",
                     env_pb2.OpenRequest(tasks=[spec], include_image=True)).episodes[0]
    assert ep.observation.text == "You are good at math.\n\nWhat is 40 + 2?"
    assert ep.observation.instruction == ep.observation.text and not ep.observation.image.png
    first = _step(client, ep.episode_id, "It is 41.")
    assert not first.observation.done and first.reward == 0.0
    assert "step-by-step reasoning" in first.observation.text
    assert first.observation.turn == 1 and first.parsed
    last = _step(client, ep.episode_id, "40 + 2 = 42\n#### 42")
    assert last.observation.done and last.reward == 1.0 and last.state.solved
    scored = client.call(reward_pb2_grpc.RewardServiceStub, "Score", reward_pb2.ScoreRequest(
        episodes=[reward_pb2.EpisodeRecord(task=spec, actions=["It is 41.", "#### 42"]),
                  reward_pb2.EpisodeRecord(task=spec, actions=["no idea"] * 3)]))
    solved, failed = scored.scores
    assert solved.solved and solved.reward == 1.0 and solved.components["task"] == 1.0
    assert not failed.solved and failed.reward == 0.0
    assert "skyrl:gsm8k_multi_turn" in scored.info.tasks


def test_unknown_skyrl_env_is_a_clear_error() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rlfleet.cli", "env", "serve",
                          "--skyrl-env", "no-such-env"], capture_output=True, text=True,
                         timeout=300)  # a bound on a hung start, not a timing
    assert out.returncode != 0
    assert "no skyrl-gym environment 'no-such-env' is registered" in out.stderr
    assert "gsm8k" in out.stderr


def test_a_replica_plays_a_skyrl_env_not_written_by_rlfleet(start_env, start_rollout) -> None:
    """A multimodal skyrl-gym environment registered with `skyrl_gym.register` (SkyRL's
    API only, tests/plugins/site/rlfleet_test_plugins/skyrl_picture.py), served by the env
    service and played by a real rollout replica with the tiny policy."""
    path = os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))
    env = start_env("--skyrl-env", PICTURE, name="env-picture", env={"PYTHONPATH": path})
    replica = start_rollout(env.address)
    request = rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="skyrl:rlfleet-test-picture", seed=3, max_turns=2),
        group_size=2, idempotency_key="picture-1", include_images=True,
        context_mode=common_pb2.CONTEXT_FULL,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_new_tokens=4, seed=7))
    trajectories = list(RpcClient(replica.address, timeout_s=300).stream(
        rollout_pb2_grpc.RolloutServiceStub, "RolloutGroup", request))
    assert sorted(t.index for t in trajectories) == [0, 1]
    for t in trajectories:
        assert 1 <= len(t.turns) <= 2 and t.final_state.done
        assert t.final_state.turns == len(t.turns)
        assert t.reward_name == "task" and t.reward_version == "1.0.0"
        assert t.reward in (0.0, 1.0) and t.solved == (t.reward == 1.0)
        assert len(t.images) == len(t.turns)  # the first picture, then one per retry
        assert all(img.png.startswith(b"\x89PNG") and (img.width, img.height) == (64, 64)
                   for img in t.images)
        model = {i for turn in t.turns for i in range(turn.start, turn.end)}
        assert {i for i, m in enumerate(t.loss_mask) if m} == model
        assert all(t.logprobs[i] < 0 for i in model)
        if not t.solved:
            assert len(t.turns) == 2 and t.turns[0].feedback == "Not quite. Count again."


def test_a_replica_plays_skyrls_own_gsm8k_env(start_env, start_rollout, tmp_path: Path,
                                              tiny_model_dir: Path) -> None:
    """skyrl-gym's own `gsm8k_multi_turn` (from the installed skyrl-gym package, not written
    by rlfleet), a text environment, served by the env service and played by a real rollout
    replica: the policy is prompted with the dataset row's chat, gets the env's own
    feedback after a wrong turn, and the group is scored through the reward contract."""
    from rlfleet.policy import load_processor

    row = {"prompt": [{"role": "user", "content": "What is 40 + 2?"}],
           "env_class": "gsm8k_multi_turn",
           "reward_spec": {"method": "rule", "ground_truth": "42"},
           "extra_info": {"max_turns": 3}}
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps(row) + "\n")
    env = start_env("--skyrl-env", f"gsm8k_multi_turn={data}", name="env-gsm8k")
    replica = start_rollout(env.address)
    request = rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="skyrl:gsm8k_multi_turn", seed=5, max_turns=2),
        group_size=2, idempotency_key="gsm8k-1", context_mode=common_pb2.CONTEXT_FULL,
        sampling=rollout_pb2.SamplingParams(temperature=1.0, max_new_tokens=4, seed=3))
    trajectories = list(RpcClient(replica.address, timeout_s=300).stream(
        rollout_pb2_grpc.RolloutServiceStub, "RolloutGroup", request))
    tokenizer = load_processor(tiny_model_dir).tokenizer
    assert sorted(t.index for t in trajectories) == [0, 1]
    for t in trajectories:
        prompt = tokenizer.decode(t.token_ids[:t.prompt_tokens])
        assert "What is 40 + 2?" in prompt and not t.images  # a text env: no picture
        assert (t.reward_name, t.reward_version) == ("task", "1.0.0")
        assert t.final_state.done and t.final_state.turns == len(t.turns)
        if t.solved:  # four sampled tokens of a random tiny policy: a solve is "#### 42"
            assert t.reward == 1.0 and "42" in t.turns[-1].text
            continue
        # (a well-formatted wrong answer earns skyrl-gym's small format credit)
        assert 0.0 <= t.reward < 1.0 and len(t.turns) == 2  # capped by the spec's max_turns
        # skyrl-gym's own words: the spec's cap is the env's max_turns, one turn was left
        assert t.turns[0].feedback == ("Now provide only the final numeric answer in the "
                                       "exact format: '#### ANSWER'.")
        model = {i for turn in t.turns for i in range(turn.start, turn.end)}
        assert {i for i, m in enumerate(t.loss_mask) if m} == model
