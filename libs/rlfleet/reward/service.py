"""The reward contract (`RewardService`) for any `RewardFunction`, and the process that
serves one (`rlfleet.reward.serve` / `main`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from pydantic import Field, create_model

from rlfleet import defaults, limits
from rlfleet.cliargs import Parser, add_setting
from rlfleet.reward import Episode, RewardFunction, Score
from rlfleet.reward.settings import RewardSettings
from rlfleet.rpc.errors import FailedPrecondition, InvalidArgument, NotFound, RpcError
from rlfleet.rpc.server import GrpcServer
from rlfleet.service import ServiceSettings, add_common_args, serve_forever, settings_or_exit
from rlfleet.tasks import TaskRegistry, default_tasks
from rlfleet.v1 import reward_pb2, reward_pb2_grpc

REWARD_SERVICE = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name


class ScoreFailed(FailedPrecondition):
    """The reward function broke its contract on an episode: it raised, or returned
    something that is not a finite score in its declared range. FAILED_PRECONDITION: the
    same episode gets the same answer on every call (a score is a pure function of the
    episode), so no caller retries it; the message names the reward, the episode and the
    value (or the exception's type and message) so that its author can fix it."""


def check_batch(what: str, n: int) -> None:
    if n == 0:
        raise InvalidArgument(f"{what}: empty batch")
    if n > limits.MAX_BATCH:
        raise InvalidArgument(f"{what}: {n} items, at most {limits.MAX_BATCH} per call")


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    """Scores batches of finished episodes with one reward function, all or nothing: every
    record is checked and replayed before any score is returned."""

    def __init__(self, reward: RewardFunction, tasks: TaskRegistry | None = None) -> None:
        self.reward = reward
        self.tasks = tasks if tasks is not None else default_tasks()
        scored = [t for t in self.tasks.names() if reward.supports(t)]
        self.info = reward_pb2.RewardInfo(
            name=reward.name, version=reward.version, components=list(reward.components),
            tasks=scored,
        )

    def Score(self, request: reward_pb2.ScoreRequest, context: grpc.ServicerContext):  # noqa: N802
        records = request.episodes
        check_batch("Score", len(records))
        for i, record in enumerate(records):
            if len(record.actions) > limits.MAX_TURNS:
                raise InvalidArgument(f"episode {i}: more than {limits.MAX_TURNS} actions")
            if any(len(a.encode()) > limits.MAX_ACTION_TEXT_BYTES for a in record.actions):
                raise InvalidArgument(
                    f"episode {i}: an action is longer than {limits.MAX_ACTION_TEXT_BYTES} bytes"
                )
        scores = []
        for i, record in enumerate(records):
            task = self.tasks.task_of(record.task)
            if not self.reward.supports(task.name):
                raise NotFound(f"episode {i}: reward {self.reward.name!r} does not score task "
                               f"{task.name!r}; it scores {list(self.info.tasks)}")
            actions = list(record.actions)
            replayed, steps = self.tasks.replay(record.task, actions)
            episode = Episode(record.task, tuple(actions), record.final_state, replayed,
                              tuple(steps))
            scores_of = (f"reward {self.reward.name!r} {self.reward.version} on episode {i} "
                         f"(task {task.name!r}, seed {record.task.seed})")
            score = self._score(episode, scores_of)
            scores.append({"reward": float(score.reward),
                           "components": {k: float(v) for k, v in score.components.items()},
                           "solved": bool(score.solved),
                           "turn_rewards": [float(v) for v in score.turn_rewards]})
        return reward_pb2.ScoreResponse(scores=scores, info=self.info)

    def _score(self, episode: Episode, where: str) -> Score:
        """The reward function's score, checked (ScoreFailed otherwise)."""
        try:
            score = self.reward.score(episode)
        except RpcError:
            raise  # the function chose its answer itself
        except Exception as exc:  # noqa: BLE001 - user code: reported, never hidden
            raise ScoreFailed(f"{where} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(score, Score):
            raise ScoreFailed(f"{where} returned {score!r}, not an rlfleet.reward.Score")
        try:
            return score.checked(where, self.reward.reward_range, len(episode.actions))
        except (ValueError, TypeError) as exc:
            raise ScoreFailed(str(exc)) from exc

    def Info(self, request, context):  # noqa: N802, ANN001, ANN201
        return self.info


def registration(servicer: RewardServicer):  # noqa: ANN201
    return lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(servicer, s) \
        or REWARD_SERVICE


def build_server(reward: RewardFunction, settings: ServiceSettings,
                 tasks: TaskRegistry | None = None) -> GrpcServer:
    servicer = RewardServicer(reward, tasks)
    return GrpcServer(f"reward-{reward.name}", settings.server_config(),
                      [registration(servicer)])


def run(server: GrpcServer, reward: RewardFunction, settings: Any = None) -> int:
    return serve_forever(server, f"reward service {reward.name} {reward.version}")


def main(reward: RewardFunction, argv: Sequence[str] | None = None, *, prog: str | None = None,
         port: int = defaults.REWARD_PORT,
         metrics_port: int = defaults.REWARD_METRICS_PORT) -> int:
    model = create_model(
        "RewardSettings", __base__=RewardSettings,
        port=(int, Field(port, ge=0, le=65535)),
        metrics_port=(int | None, Field(metrics_port, ge=0, le=65535)),
    )
    parser = Parser(prog=prog, description=f"the {reward.name} {reward.version} reward service")
    add_common_args(parser, model)
    add_setting(parser, "--grace-s", model, type=float)  # help: the field's description
    args = parser.parse_args(argv)
    settings = settings_or_exit(model, args, f"reward {reward.name}")
    return run(build_server(reward, settings), reward, settings)
