"""SkyRL's env API driving a real env service over gRPC."""

from __future__ import annotations

import skyrl_gym

from rlfleet.maze.actions import ActionFormat, format_action
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.oracle import oracle_actions
from rlfleet.skyrl import remote_env


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
