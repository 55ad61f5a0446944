"""A multimodal skyrl-gym environment, not written for rlfleet: SkyRL's own API only.

Importing this module registers ``rlfleet-test-picture`` with `skyrl_gym.register`. Each
observation is an OpenAI-style user message with a PNG data URL (a grey square with some
dark cells) and a question; the answer is the number of dark cells. Two tries."""

from __future__ import annotations

import base64
import io
import random
import re

import skyrl_gym
from PIL import Image
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

ENV_ID = "rlfleet-test-picture"


def _picture(count: int, seed: int) -> str:
    rng = random.Random(seed)
    img = Image.new("RGB", (64, 64), (200, 200, 200))
    cells = rng.sample(range(16), count)
    for cell in cells:
        x, y = (cell % 4) * 16, (cell // 4) * 16
        for dx in range(2, 14):
            for dy in range(2, 14):
                img.putpixel((x + dx, y + dy), (30, 30, 30))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _message(count: int, seed: int, text: str) -> dict:
    return {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": _picture(count, seed)}},
        {"type": "text", "text": text}]}


class PictureCountEnv(BaseTextEnv):
    def __init__(self, env_config=None, extras=None) -> None:  # noqa: ANN001
        super().__init__()
        extras = extras or {}
        self.seed = int(extras.get("extra_info", {}).get("seed", extras.get("seed", 0)))
        self.count = 1 + self.seed % 5
        self.max_turns = int(extras.get("max_turns", 2))

    def init(self, prompt):  # noqa: ANN001, ANN201
        return [*(prompt or []), _message(self.count, self.seed,
                                          "How many dark squares are there?")], {}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        numbers = re.findall(r"\d+", action)
        right = bool(numbers) and int(numbers[-1]) == self.count
        done = right or self.turns >= self.max_turns
        observations = [] if done else [_message(self.count, self.seed + self.turns,
                                                 "Not quite. Count again.")]
        return BaseTextEnvStepOutput(observations=observations, reward=float(right),
                                     done=done, metadata={"count": self.count})


if ENV_ID not in skyrl_gym.registry:
    skyrl_gym.register(id=ENV_ID, entry_point=PictureCountEnv)
