"""A remote rlfleet env service behind SkyRL's `BaseTextEnv`, so SkyRL's own trainer can
drive our services: `skyrl_gym.make("rlfleet-remote-maze", env_config={"address": ...},
extras={"seed": 7})`.

Each SkyRL env object is one episode on the service: opened in `init`, stepped with the
model's text in `step`, closed when done (or by the service's idle expiry if the trainer
drops it). The task fields come from `extras` as in the in-process env (seed, task, size,
max_turns, action_format, cell_px).
"""

from __future__ import annotations

import base64
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from rlfleet.clients.env import EnvClient
from rlfleet.config import read_secret
from rlfleet.names import to_wire
from rlfleet.skyrl.maze_env import _options
from rlfleet.v1 import common_pb2, env_pb2

ENV_ID = "rlfleet-remote-maze"
ENTRY_POINT = "rlfleet.skyrl.remote_env:RemoteMazeSkyRLEnv"


def _content(observation: common_pb2.Observation) -> list[dict[str, Any]]:
    url = "data:image/png;base64," + base64.b64encode(observation.image.png).decode("ascii")
    return [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": observation.text},
    ]


def task_spec(options: dict[str, Any]) -> common_pb2.TaskSpec:
    return common_pb2.TaskSpec(
        task=str(options.get("task", "maze_2d")),
        seed=int(options.get("seed", 0)),
        size=int(options.get("size") or 0),
        max_turns=int(options.get("max_turns") or 0),
        format=to_wire(common_pb2.ActionFormat, str(options.get("action_format") or "")),
        render=common_pb2.RenderOptions(cell_px=int(options.get("cell_px") or 0)),
    )


class RemoteMazeSkyRLEnv(BaseTextEnv):
    """One episode of a remote env service. env_config: {"address": "host:port",
    "timeout_s": 30}; the shared token, if any, comes from RLFLEET_AUTH_TOKEN."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        config = dict(env_config or {})
        if not config.get("address"):
            raise ValueError("env_config needs 'address' (host:port of an rlfleet env service)")
        self.client = EnvClient(
            config["address"],
            token=read_secret("RLFLEET_AUTH_TOKEN"),
            timeout_s=float(config.get("timeout_s", 30.0)),
        )
        self.task_spec = task_spec(_options(extras or {}))
        self.episode_id: str | None = None
        self.solved = False

    def init(self, prompt: ConversationType | None) -> tuple[ConversationType, dict[str, Any]]:
        episode = self.client.open([self.task_spec], include_image=True)[0]
        self.episode_id = episode.episode_id
        self.max_turns = self.task_spec.max_turns or 0
        conversation = [dict(m) for m in (prompt or [])]
        conversation.append({"role": "user", "content": _content(episode.observation)})
        return conversation, {"episode_id": self.episode_id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.episode_id is None:
            raise RuntimeError("init() must be called before step()")
        result = self.client.step([env_pb2.Action(episode_id=self.episode_id, text=action)],
                                  include_image=True)[0]
        obs = result.observation
        self.turns = obs.turn
        self.solved = result.state.solved
        if obs.done:
            self.close()
        return BaseTextEnvStepOutput(
            observations=[] if obs.done else [{"role": "user", "content": _content(obs)}],
            reward=result.reward,
            done=obs.done,
            metadata={"feedback": obs.feedback, "parsed": result.parsed,
                      "action": result.action, "solved": result.state.solved},
            postprocessed_action=None,
        )

    def get_metrics(self) -> dict[str, Any]:
        return {"solved": float(self.solved), "turns": self.turns}

    def close(self) -> None:
        if self.episode_id is not None:
            self.client.close_episodes([self.episode_id])
            self.episode_id = None
        self.client.close()


def register() -> None:
    """Make `skyrl_gym.make("rlfleet-remote-maze", ...)` work; idempotent."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=ENTRY_POINT)
