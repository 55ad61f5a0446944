"""The in-process SkyRL environment: registration, multimodal observations, steps."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

skyrl_gym = pytest.importorskip("skyrl_gym")

from rlfleet.maze import generate_layout, oracle_texts  # noqa: E402
from rlfleet.skyrl.maze_env import ENV_ID, MazeSkyRLEnv, register  # noqa: E402


def _image(content: list[dict]) -> Image.Image:
    url = content[0]["image_url"]["url"]
    assert content[0]["type"] == "image_url" and url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def test_register_is_idempotent_and_make_works() -> None:
    register()
    register()
    env = skyrl_gym.make(ENV_ID, env_config=None, extras={"extra_info": {"seed": 2}})
    assert isinstance(env, MazeSkyRLEnv)
    assert env.episode.layout == generate_layout(2, 9) and env.max_turns == 20


def test_init_merges_picture_into_the_last_user_message() -> None:
    env = MazeSkyRLEnv(extras={"seed": 1, "cell_px": 16})
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}]
    conversation, info = env.init(prompt)
    assert prompt[-1]["content"] == "Go."  # the caller's prompt is not modified
    assert [m["role"] for m in conversation] == ["system", "user"]
    content = conversation[-1]["content"]
    assert _image(content).size == (144, 144)
    assert content[1]["type"] == "text" and content[1]["text"].startswith("Go.")
    assert "('move', direction)" in content[1]["text"]
    assert isinstance(info, dict)


def test_init_without_prompt_adds_a_user_message() -> None:
    conversation, _ = MazeSkyRLEnv(extras={"seed": 1}).init([])
    assert len(conversation) == 1 and conversation[0]["role"] == "user"
    assert _image(conversation[0]["content"]).size == (225, 225)


def test_steps_to_a_solve() -> None:
    env = MazeSkyRLEnv(extras={"seed": 4, "action_format": "tags"})
    env.init([])
    texts = oracle_texts(env.episode.layout, fmt="tags")
    for text in texts[:-1]:
        out = env.step(text)
        assert out["reward"] == 0.0 and not out["done"]
        assert out["observations"][0]["role"] == "user"
        assert "Feedback: Moved" in out["observations"][0]["content"][1]["text"]
    out = env.step(texts[-1])
    assert out["done"] and out["reward"] == 1.0 and out["observations"] == []
    assert out["metadata"]["solved"] and out["metadata"]["format_ok"]
    metrics = env.get_metrics()
    assert metrics["solved"] == 1.0 and metrics["format_ok_rate"] == 1.0
    assert env.turns == len(texts)


def test_wall_bump_and_garbage_feedback() -> None:
    env = MazeSkyRLEnv(extras={"seed": 0})  # agent (7,1): the cell below is a wall
    env.init([])
    out = env.step("('move', 3)")
    assert "Cannot move into a wall" in out["metadata"]["feedback"] and not out["done"]
    out = env.step("\x00garbage")
    feedback = out["metadata"]["feedback"]  # VisGym's sentence
    assert feedback.startswith("Cannot parse action string '\\x00garbage': ")
    assert feedback.endswith(" so the action is invalid.")
    assert out["metadata"]["invalid_turns"] == 1 and out["metadata"]["wall_bumps"] == 1


def test_replays_a_visgym_initial_state() -> None:
    state = generate_layout(6, 11).to_init_state()
    env = MazeSkyRLEnv(extras={"init_state": state, "max_turns": 40})
    assert env.episode.layout == generate_layout(6, 11) and env.max_turns == 40


def test_bad_extras_rejected() -> None:
    with pytest.raises(ValueError):
        MazeSkyRLEnv(extras={"seed": 0, "size": 8})
    with pytest.raises(ValueError):
        MazeSkyRLEnv(extras={"task": "nope"})
