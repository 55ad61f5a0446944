"""The visgym observation profile: what the rollout service sends the model equals, token
for token through the 8B path's chat template, the messages VisGym's own harness sends
(golden episodes in tests/data/visgym/maze_2d/golden/, written from the recorded facts
by tests/visgym_reference.py), and its frames are VisGym's pixels and JPEG bytes."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random

import numpy as np
import pytest
from PIL import Image

from rlfleet.engines.base import Generation
from rlfleet.learner_config import DataConfig
from rlfleet.maze import generate_layout
from rlfleet.maze.episode import MazeEpisode
from rlfleet.maze.layout import Layout
from rlfleet.maze.visgym import answer_of, instruction_text
from rlfleet.maze.visgym_frame import render_visgym_rgb, visgym_frame
from rlfleet.policy.chat import ChatCodec
from rlfleet.policy.observation import (
    ForeignProfileError,
    check_observation_profile,
    mark_observation_profile,
    profile_marks,
)
from rlfleet.rpc.errors import FailedPrecondition, InvalidArgument
from rlfleet.tasks.maze import MazeTaskEpisode, episode_from_spec
from rlfleet.v1 import common_pb2, rollout_pb2
from rlfleet_env.convert import observation_proto
from rlfleet_rollout.episodes import EpisodeBuffer, GroupPlayer
from tests import visgym_reference as ref
from tests.factories import SFT
from tests.scaled_8b import scaled_8b_processor

NAMES = ("solve", "wall_bump", "invalid", "timeout", "timeout_20", "verbalized")


def golden(name: str) -> dict:
    return json.loads((ref.GOLDEN / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def codec() -> ChatCodec:
    return ChatCodec(scaled_8b_processor())


def test_the_golden_files_are_the_reference_harness_output() -> None:
    for name, episode in ref.golden_episodes().items():
        assert golden(name) == json.loads(json.dumps(episode)), f"{name}.json is stale"


def test_the_instruction_is_visgyms() -> None:
    assert instruction_text(9, 9) == ref.instruction(9, 9)
    assert instruction_text(11, 11) == ref.instruction(11, 11)


def _play_through_the_rollout(name: str, codec: ChatCodec):
    """The episode as the rollout service plays it: env observations (the env service's
    protos), the replies as generated turns ending in <|im_end|>."""
    g = golden(name)
    spec = common_pb2.TaskSpec(task="maze_2d", seed=g["seed"], size=g["size"],
                               max_turns=g["max_turns"],
                               format=common_pb2.ACTION_FORMAT_VISGYM)
    ep = MazeTaskEpisode(episode_from_spec(spec))
    first = observation_proto(ep, first=True, include_image=True)
    buf = EpisodeBuffer(codec, "visgym", instruction=first.instruction)
    buf.start(first)
    observations = [first]
    for reply in g["replies"]:
        ids = codec.tokenizer(reply, add_special_tokens=False)["input_ids"] + [codec.im_end_id]
        buf.add_turn(Generation(ids, [0.0] * len(ids), reply, "stop"), reply)
        ep.step(reply)
        if ep.done:
            break
        obs = observation_proto(ep, first=False, include_image=True)
        buf.add_observation(obs)
        observations.append(obs)
    return g, ep, buf, observations


@pytest.mark.parametrize("name", NAMES)
def test_the_rollout_sends_visgyms_messages_token_for_token(name: str, codec) -> None:
    g, ep, buf, observations = _play_through_the_rollout(name, codec)
    # each observation: VisGym's text, a JPEG with VisGym's pixel and byte hashes
    users = [m for m in g["messages"] if m["role"] == "user"]
    assert len(observations) == len(users) == len(g["frames"])
    messages = []
    for obs, user, frame, reply in zip(observations, users, g["frames"], g["replies"],
                                       strict=False):
        assert obs.text == user["content"][1]["text"]
        assert obs.image.media_type == "image/jpeg"
        assert hashlib.sha256(obs.image.png).hexdigest() == frame["jpeg_sha256"]
        url = user["content"][0]["image_url"]["url"]
        assert url == "data:image/jpeg;base64,sha256:" + frame["jpeg_sha256"]
        messages.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": ref.data_url(obs.image.png)}},
            {"type": "text", "text": user["content"][1]["text"]}]})
        messages.append({"role": "assistant", "content": reply})
    assert [m["content"] for m in g["messages"] if m["role"] == "assistant"] == \
        g["replies"][:g["end"]["turns"]]
    # the whole chat through the checkpoint's template: the rollout's sequence is it, up to
    # the newline the template writes after the last <|im_end|> (nothing follows the end)
    want = codec.encode_conversation(messages, add_generation_prompt=False).token_ids
    assert buf.token_ids == want[:len(buf.token_ids)]
    assert codec.tokenizer.decode(want[len(buf.token_ids):]) == "\n"
    assert len(buf.turns) == g["end"]["turns"]
    # and it ends as VisGym's harness ends it
    assert ep.turns == g["end"]["turns"] and ep.truncated == g["end"]["truncated"]
    assert ep.env_return == g["end"]["reward"]


def test_1200_random_states_give_visgyms_pixels_and_bytes() -> None:
    rng = random.Random(21)
    differing, states, holes = 0, 0, 0
    while states < 1200:
        seed = rng.randrange(10_000)
        layout = generate_layout(seed, 9)
        start = layout.agent
        if rng.random() < 0.5:  # next to the target: the walk reaches it and leaves it
            row, col = layout.target
            start = next((row + dr, col + dc) for dr, dc in ((0, 1), (-1, 0), (0, -1), (1, 0))
                         if layout.is_floor((row + dr, col + dc)))
        env = ref.Env(seed, start=start)
        episode = MazeEpisode(Layout.from_walls(layout.walls, start, layout.target), 60,
                              "visgym")
        for _ in range(rng.randrange(1, 40)):
            move = rng.randrange(4)
            env.step(f"('move', {move})")
            episode.step(f"('move', {move})")
            want = env.render()
            got = render_visgym_rgb(episode.layout, episode.agent, episode.left_target)
            frame = visgym_frame(episode.layout, episode.agent, episode.left_target)
            same = np.array_equal(want, got) and \
                hashlib.sha256(frame.png).digest() == hashlib.sha256(ref.jpeg(want)).digest()
            differing += not same
            holes += episode.left_target and episode.agent != episode.layout.target
            states += 1
    assert differing == 0
    assert holes > 0  # states after the agent left the target were among them


def test_the_white_disc_stays_in_the_target_after_the_agent_leaves() -> None:
    layout = generate_layout(3, 9)
    row, col = layout.target
    beside = next((row + dr, col + dc) for dr, dc in ((0, 1), (-1, 0), (0, -1), (1, 0))
                  if layout.is_floor((row + dr, col + dc)))
    cell = render_visgym_rgb(layout, beside, True)[row * 25:(row + 1) * 25,
                                                   col * 25:(col + 1) * 25]
    white = (cell == 255).all(-1)
    assert white.sum() == 104 and ((cell == (255, 0, 0)).all(-1) | white).all()
    whole = render_visgym_rgb(layout, beside, False)[row * 25:(row + 1) * 25,
                                                     col * 25:(col + 1) * 25]
    assert (whole == (255, 0, 0)).all()


def test_frames_are_pillows_default_jpeg_quality_75() -> None:
    layout = generate_layout(0, 9)
    frame = visgym_frame(layout, layout.agent, False)
    assert frame.media_type == "image/jpeg" and (frame.width, frame.height) == (225, 225)
    pixels = render_visgym_rgb(layout, layout.agent, False)
    assert frame.png == ref.jpeg(pixels)  # the recorded quality, given explicitly
    assert Image.open(io.BytesIO(frame.png)).format == "JPEG"


def test_the_answer_tag_is_cut_as_visgym_cuts_it() -> None:
    assert answer_of("<think>a</think><answer>('move', 0)</answer>") == "('move', 0)"
    assert answer_of("<answer>x</answer><answer>y</answer>") == "x"  # the first one
    assert answer_of("<answer>('stop', 'stop')") == "('stop', 'stop')"
    assert answer_of("('move', 1)") == "('move', 1)"


def test_the_visgym_profile_refuses_other_cell_sizes_at_start() -> None:
    with pytest.raises(ValueError, match="VisGym's 25 px cells, got cell_px=16"):
        MazeEpisode(generate_layout(0, 9), 15, "visgym", cell_px=16)
    with pytest.raises(ValueError, match=r"225 px frames at size 9\); data.cell_px=16"):
        DataConfig(context="visgym", size=9, cell_px=16)
    assert DataConfig(context="visgym", size=9, cell_px=25).cell_px == 25


def test_the_shipped_tiny_sft_marks_visgym_foreign(tmp_path) -> None:
    marks = profile_marks(SFT)
    assert marks.trained == "frame_only" and marks.foreign == ("visgym",)
    check_observation_profile(SFT, "frame_only")
    with pytest.raises(ForeignProfileError, match=r"'visgym' is foreign to the checkpoint "
                                                  r".*trained on 'frame_only'"):
        check_observation_profile(SFT, "visgym")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    check_observation_profile(model, "visgym")  # nothing declared: nothing refused
    mark_observation_profile(model, "visgym", ("frame_only", "last_frame"))
    assert profile_marks(model).foreign == ("frame_only", "last_frame")
    (model / "README.md").write_text("foreign_observation_profiles: [nonsense]\n")
    assert profile_marks(model).trained == "visgym"  # config.json wins
    (model / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"unknown observation profiles \['nonsense'\]"):
        profile_marks(model)


def _player(marks_dir) -> GroupPlayer:
    # the checks run before the player calls the engine, the env or the reward service
    return GroupPlayer(batcher=None, codec=None, env=None, reward=None, replica_id="r",
                       model_dir=str(marks_dir), profile_marks=profile_marks(marks_dir))


def test_a_replica_refuses_a_profile_its_checkpoint_marks_foreign() -> None:
    request = rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=0), group_size=1,
        context_mode=common_pb2.CONTEXT_VISGYM)
    with pytest.raises(FailedPrecondition, match="'visgym' is foreign"):
        next(_player(SFT).play(request, adapter=None, is_active=lambda: True))


def test_the_visgym_context_plays_its_task_in_the_visgym_format_only(tmp_path) -> None:
    request = rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task="maze_2d", seed=0,
                                 format=common_pb2.ACTION_FORMAT_TAGS),
        group_size=1, context_mode=common_pb2.CONTEXT_VISGYM)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InvalidArgument, match="action format visgym, the request asks for "
                                              "ACTION_FORMAT_TAGS"):
        next(_player(tmp_path).play(request, adapter=None, is_active=lambda: True))


def test_observations_carry_the_jpeg_media_type_in_a_data_url() -> None:
    from rlfleet.policy.contexts import observation_message

    msg = observation_message(b"\xff\xd8jpeg", "t", "image/jpeg")
    assert msg["content"][0]["image_url"]["url"] == \
        "data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8jpeg").decode()
    assert observation_message(b"png", "t")["content"][0]["image_url"]["url"].startswith(
        "data:image/png;base64,")


def test_the_production_config_selects_the_visgym_profile_the_goldens_pin() -> None:
    import yaml

    from rlfleet.learner_config import LearnerConfig
    from tests.factories import REPO

    cfg = LearnerConfig.model_validate(
        yaml.safe_load((REPO / "configs" / "qwen3-vl-8b-hyperpod.yaml").read_text()))
    values = yaml.safe_load((REPO / "deploy/helm/rlfleet/values-hyperpod.yaml").read_text())
    assert cfg.data.context == values["learner"]["config"]["data"]["context"] == "visgym"
    # VisGym's own step limit for its easy mazes, as its harness plays it
    g = golden("timeout_20")
    assert (cfg.data.size, cfg.data.max_turns, cfg.data.cell_px) == \
        (g["size"], g["max_turns"], ref.HARNESS["image"]["cell_px"])
    assert cfg.data.max_turns == ref.HARNESS["episode"]["max_steps"]["9"]
    # a verbalized reply fits its reply budget (the goldens' longest, in its tokens)
    codec = ChatCodec(scaled_8b_processor())
    longest = max(golden("verbalized")["replies"], key=len)
    assert len(codec.tokenizer(longest, add_special_tokens=False)["input_ids"]) < \
        cfg.data.max_new_tokens
    # the reference eval: the 64 fixed 9x9 mazes, seeds 0..63, greedy (requests.py)
    assert (cfg.eval.eval_seeds, cfg.eval.heldout_seeds) == (64, 0)


def test_visgym_requests_draw_visgyms_cells_by_default() -> None:
    """The rollout's default cell size for the visgym profile is VisGym's (the constant is
    spelled in rlfleet.policy.contexts to keep the maze package out of every CLI start)."""
    from rlfleet.maze.visgym import VISGYM_CELL_PX
    from rlfleet.policy.contexts import CONTEXT_CELL_PX

    assert CONTEXT_CELL_PX == {"visgym": VISGYM_CELL_PX}
