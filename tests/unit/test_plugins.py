"""Env tasks and reward functions as plugins, through the real entry-point mechanism: the
test packages under tests/plugins are put on sys.path with their dist-info, which
`importlib.metadata` reads as it reads any installed package's."""

from __future__ import annotations

import math
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from rlfleet.registries import RegistryError
from rlfleet.reward import (
    Episode,
    RewardFunction,
    RewardRegistry,
    Score,
    default_rewards,
    reward_function,
)
from rlfleet.rpc.errors import InvalidArgument, NotFound
from rlfleet.tasks import Task, TaskRegistry, default_tasks
from rlfleet.v1 import common_pb2

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


@pytest.fixture
def plugins(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS / "site"))


def spec(task: str, seed: int = 0, **kw) -> common_pb2.TaskSpec:
    return common_pb2.TaskSpec(task=task, seed=seed, **kw)


def test_without_plugins_only_rlfleets_own() -> None:
    assert "countdown" not in default_tasks()
    assert default_tasks().names() == ["maze_2d", "maze_2d_hard"]
    assert default_rewards().names() == ["format+task", "novelty", "progress", "task"]


def test_a_plugin_task_is_found_through_its_entry_point(plugins) -> None:
    tasks = default_tasks()
    assert tasks.names() == ["countdown", "maze_2d", "maze_2d_hard"]
    assert "rlfleet-test-plugins 0.1.0" in tasks._registry.source("countdown")
    episode = tasks.open(spec("countdown", seed=1))  # counts down from 4
    assert "Count down from 4" in episode.instruction and episode.feedback == "The number is 4."
    assert not episode.step("five").parsed
    for n in (3, 2, 1):
        assert episode.step(f"{n}").parsed and not episode.done
    last = episode.step("0")
    assert last.reward == 1.0 and episode.done and episode.solved
    assert episode.turns == 5 and episode.invalid_turns == 1 and episode.env_return == 1.0


def test_a_plugin_reward_is_found_and_scores_any_task(plugins) -> None:
    reward = default_rewards().get("turn-count")
    assert (reward.name, reward.version, reward.components) == ("turn-count", "0.1.0",
                                                                ("task", "turns"))
    tasks = default_tasks()
    for task, actions in (("countdown", ["2", "1", "0"]), ("maze_2d", ["('move', 0)"])):
        replayed, steps = tasks.replay(spec(task, seed=0), actions)
        score = reward.score(Episode(spec(task), tuple(actions), None, replayed, tuple(steps)))
        assert score.components["turns"] == len(actions)
    assert score.reward == pytest.approx(-0.01)


def test_duplicate_names_are_refused_never_overwritten(plugins, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS / "duplicates"))
    with pytest.raises(RegistryError) as err:
        default_tasks()
    message = str(err.value)
    assert "task 'countdown' is defined twice" in message
    assert "rlfleet-test-plugins 0.1.0" in message and "rlfleet-test-duplicates 0.1.0" in message
    with pytest.raises(RegistryError, match=r"reward 'task' is defined twice: by rlfleet \(built "
                                          r"in\) and by entry point 'task'"):
        default_rewards()


def test_a_builtin_name_cannot_be_taken_in_code() -> None:
    tasks = default_tasks(discover=False)
    with pytest.raises(RegistryError, match="'maze_2d' is defined twice"):
        tasks.add(tasks.get("maze_2d"))


def _ep(name: str, value: str, group: str = "rlfleet.tasks") -> EntryPoint:
    return EntryPoint(name=name, value=value, group=group)


def test_entry_points_that_cannot_be_used_say_why(plugins) -> None:
    registry = TaskRegistry().discover([
        _ep("renamed", "rlfleet_test_plugins:CountdownTask"),
        _ep("missing", "no_such_module_anywhere:Task"),
        _ep("wrong-kind", "rlfleet_test_plugins:turn_count"),
    ])
    with pytest.raises(RegistryError, match="calls itself 'countdown'"):
        registry.get("renamed")
    with pytest.raises(RegistryError, match="failed to load: ModuleNotFoundError"):
        registry.get("missing")
    with pytest.raises(RegistryError, match="is a _FunctionReward, not a task"):
        registry.get("wrong-kind")
    with pytest.raises(NotFound, match="unknown task 'nope'"):
        registry.get("nope")


def test_the_registry_checks_what_every_task_shares(plugins) -> None:
    tasks = default_tasks()
    with pytest.raises(NotFound):
        tasks.open(spec("no-such-task"))
    with pytest.raises(InvalidArgument, match="seed"):
        tasks.open(spec("countdown", seed=-1))
    with pytest.raises(InvalidArgument, match="max_turns"):
        tasks.open(spec("countdown", max_turns=1001))
    with pytest.raises(InvalidArgument, match="task 'countdown': countdown takes a seed"):
        tasks.open(spec("countdown", size=9))
    with pytest.raises(InvalidArgument, match="task name longer"):
        tasks.open(spec("x" * 65))
    only = tasks.only(["countdown"])
    assert only.names() == ["countdown"] and "maze_2d" not in only
    assert only.open(common_pb2.TaskSpec(seed=2)).instruction.startswith("Count down from 5")


def test_reward_functions_and_scores() -> None:
    @reward_function("half", "2.0.0", components=("task",), tasks=["maze_2d"])
    def half(episode: Episode) -> Score:
        return Score(episode.env_return / 2, {"task": episode.env_return})

    assert isinstance(half, RewardFunction) and half.supports("maze_2d")
    assert not half.supports("maze_2d_hard")
    with pytest.raises(ValueError, match="finite"):
        Score(math.nan).checked("episode 0")
    with pytest.raises(ValueError, match="components\\['x'\\]"):
        Score(1.0, {"x": math.inf}).checked("episode 0")
    assert Score(1.0, {"task": 1.0}, True).checked("e") == Score(1.0, {"task": 1.0}, True)


def test_a_task_is_a_plain_subclass() -> None:
    class Echo(Task):
        from rlfleet.tasks import TaskInfo

        info = TaskInfo("echo")

        def open(self, spec):  # noqa: ANN001, ANN202
            raise ValueError("never")

    registry = TaskRegistry().add(Echo())
    with pytest.raises(InvalidArgument, match="task 'echo': never"):
        registry.open(spec("echo"))


def test_a_reward_declares_its_range() -> None:
    with pytest.raises(ValueError, match=r"reward 1.5 is outside the declared range \[0, 1\]"):
        Score(1.5).checked("episode 0", (0.0, 1.0))
    assert Score(-3.0).checked("e").reward == -3.0  # no range given: finite is enough

    @reward_function("bad-range", "1.0.0", reward_range=(1.0, 0.0))
    def bad(episode: Episode) -> Score:
        return Score(0.0)

    with pytest.raises(RegistryError, match="reward_range"):
        RewardRegistry().add(bad)


# A process of its own: the profile and format registries discover their entry points once
# per process, and this one has the plugins on its path from the start.
PROFILE_PLUGIN = """
import json
from rlfleet.cli import build_parser
from rlfleet.learner_config import LearnerConfig
from rlfleet.maze import generate_layout
from rlfleet.maze.episode import MazeEpisode
from rlfleet.policy.profiles import SERVING_PROFILES, serving_profile
from rlfleet_rollout.settings import RolloutSettings

profile = serving_profile("test-vlm")
args = build_parser().parse_args(["rollout", "serve", "--profile", "test-vlm"])
episode = MazeEpisode(generate_layout(0, 7), action_format="tags-visgym", cell_px=25)
step = episode.step("<action>up</action>")
print(json.dumps({
    "source": SERVING_PROFILES.source("test-vlm"),
    "vllm": profile.vllm_kwargs(max_staleness=1),
    "flag": args.profile,
    "rollout": RolloutSettings(profile="test-vlm").profile,
    "learner": LearnerConfig.model_validate({"model": {"profile": "test-vlm"}}).model.profile,
    "format": [str(episode.action_format), episode.visgym, step.parsed],
}))
"""


def test_a_plugin_adds_a_policy_profile_and_an_action_format() -> None:
    import json
    import os
    import subprocess
    import sys

    path = [str(PLUGINS / "site"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    out = subprocess.run([sys.executable, "-c", PROFILE_PLUGIN], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert "rlfleet-test-plugins 0.1.0" in got["source"]
    assert got["vllm"] == {"dtype": "bfloat16", "max_model_len": 8192, "max_lora_rank": 16,
                           "max_loras": 2, "max_images_per_prompt": 10}
    assert got["flag"] == got["rollout"] == got["learner"] == "test-vlm"
    assert got["format"] == ["tags", True, True]  # tags read, VisGym's sentences


def test_an_unknown_profile_names_the_known_ones() -> None:
    from rlfleet.config import ConfigError, load_config
    from rlfleet.learner_config import LearnerConfig

    with pytest.raises(ConfigError, match=r"unknown policy profile 'nope'; registered: "
                                          r"\['qwen3-vl-8b', 'qwen3-vl-8b-hard', "
                                          r"'tiny'"):
        load_config(LearnerConfig, overrides={"model": {"profile": "nope"}}, env={})
