"""The maze as an in-process `skyrl_gym` environment (SkyRL's text-env API).

SkyRL builds an env per trajectory with `skyrl_gym.make("rlfleet-maze", env_config=...,
extras=...)`, calls `init(prompt)` once and `step(model_text)` per turn. Observations are
OpenAI-style chat messages whose content is a list: the maze picture as a PNG data URL
(`{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`) followed by
the text. Which maze is played comes from `extras` (top level or `extras["extra_info"]`,
the place SkyRL datasets put per-sample fields):

- `seed` (default 0) with optional `task` ("maze_2d"), `size`, `max_turns`,
  `action_format` ("literal"/"tags"/"visgym") and `cell_px`; or
- `init_state`: a VisGym saved initial state (maze_map, agent_location, target_location).

The reward of each step is the episode's reward (1.0 on the solving stop, else 0).
"""

from __future__ import annotations

import base64
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from rlfleet.maze.episode import MazeEpisode, Observation
from rlfleet.maze.layout import Layout
from rlfleet.maze.tasks import get_task, new_episode

ENV_ID = "rlfleet-maze"
ENTRY_POINT = "rlfleet.skyrl.maze_env:MazeSkyRLEnv"


def _options(extras: dict[str, Any]) -> dict[str, Any]:
    # Per-sample fields may sit at the top level or under extra_info; top level wins.
    merged = dict(extras.get("extra_info") or {})
    merged.update({k: v for k, v in extras.items() if k != "extra_info"})
    return merged


def build_episode(options: dict[str, Any]) -> MazeEpisode:
    """The episode that `options` (merged extras) describe; ValueError on bad values."""
    task = options.get("task", "maze_2d")
    if "init_state" in options:
        spec = get_task(task)
        layout = Layout.from_init_state(options["init_state"])
        return MazeEpisode(
            layout,
            max_turns=options.get("max_turns"),
            action_format=options.get("action_format", spec.action_format),
            cell_px=options.get("cell_px", spec.cell_px),
        )
    return new_episode(
        task,
        int(options.get("seed", 0)),
        size=options.get("size"),
        max_turns=options.get("max_turns"),
        action_format=options.get("action_format"),
        cell_px=options.get("cell_px"),
    )


def observation_content(observation: Observation, text: str) -> list[dict[str, Any]]:
    """An OpenAI-style content list: the picture as a PNG data URL, then `text`."""
    url = "data:image/png;base64," + base64.b64encode(observation.png).decode("ascii")
    return [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": text},
    ]


class MazeSkyRLEnv(BaseTextEnv):
    """One maze episode behind SkyRL's `BaseTextEnv` interface."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.episode = build_episode(_options(extras or {}))
        self.max_turns = self.episode.max_turns

    def init(self, prompt: ConversationType | None) -> tuple[ConversationType, dict[str, Any]]:
        """The dataset prompt plus the first picture and the instruction.

        If the prompt ends with a user message, the picture joins that message (so the
        chat does not hold two user turns in a row); otherwise a user message is added.
        """
        conversation = [dict(m) for m in (prompt or [])]
        obs = self.episode.observe()
        if conversation and conversation[-1].get("role") == "user":
            last = conversation[-1]
            prior = last.get("content")
            prior_text = prior if isinstance(prior, str) else ""
            text = f"{prior_text}\n\n{obs.text}" if prior_text else obs.text
            last["content"] = observation_content(obs, text)
        else:
            conversation.append({"role": "user", "content": observation_content(obs, obs.text)})
        return conversation, {"layout": repr(self.episode.layout)}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One model reply; the next picture and feedback unless the episode is over."""
        outcome = self.episode.step(action)
        self.turns = self.episode.stats.turns
        observations: ConversationType = []
        if not outcome.done:
            obs = self.episode.observe()
            observations = [{"role": "user", "content": observation_content(obs, obs.status)}]
        return BaseTextEnvStepOutput(
            observations=observations,
            reward=outcome.reward,
            done=outcome.done,
            metadata={
                "feedback": outcome.feedback,
                "format_ok": outcome.format_ok,
                "matched_format": outcome.matched_format,
                "agent": list(outcome.agent),
                **self.episode.stats.as_dict(),
            },
            postprocessed_action=None,
        )

    def get_metrics(self) -> dict[str, Any]:
        stats = self.episode.stats
        turns = max(stats.turns, 1)
        return {
            "solved": float(stats.solved),
            "turns": stats.turns,
            "format_ok_rate": stats.format_ok_turns / turns,
            "invalid_turns": stats.invalid_turns,
            "wall_bumps": stats.wall_bumps,
            "truncated": float(stats.truncated),
        }


def register() -> None:
    """Make `skyrl_gym.make("rlfleet-maze", ...)` work; calling it again is harmless."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=ENTRY_POINT)
