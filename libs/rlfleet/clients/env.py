"""The env service's client: open, step and close episodes in batches; list tasks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlfleet.clients.base import ServiceClient
from rlfleet.v1 import common_pb2, env_pb2, env_pb2_grpc


class EnvClient(ServiceClient):
    """Errors: InvalidArgument (bad spec, sizes), NotFound (unknown task or episode),
    FailedPrecondition (step after done), ResourceExhausted (too many open episodes),
    Unavailable, DeadlineExceeded (rlfleet.rpc.errors)."""

    SERVICE = "rlfleet.v1.EnvService"
    STUB = env_pb2_grpc.EnvServiceStub
    # Open and Step are not re-sent: an Open the env applied before the answer was lost
    # would open a second set of episodes (held against the open-episode limit until
    # they expire), a Step would move each episode twice. A re-sent Close only reports
    # the ids its first attempt closed as not found.
    IDEMPOTENT = frozenset({"Close", "ListTasks"})

    def open(self, tasks: Sequence[common_pb2.TaskSpec], *, include_image: bool = False,
             timeout_s: float | None = None, request_id: str = "") -> list[env_pb2.Episode]:
        """One new episode per task spec, in order. `request_id` (<= 128 bytes) names
        them: when the answer is lost, `close_episodes(request_ids=[...])` closes them."""
        reply = self._unary("Open", env_pb2.OpenRequest(tasks=tasks, include_image=include_image,
                                                        request_id=request_id), timeout_s)
        return list(reply.episodes)

    def step(self, actions: Sequence[env_pb2.Action], *, include_image: bool = False,
             timeout_s: float | None = None) -> list[env_pb2.StepResult]:
        """Applies one action text per episode; the results in the actions' order."""
        reply = self._unary("Step", env_pb2.StepRequest(actions=actions,
                                                        include_image=include_image), timeout_s)
        return list(reply.results)

    def close_episodes(self, episode_ids: Iterable[str], *, timeout_s: float | None = None,
                       request_ids: Iterable[str] = ()) -> env_pb2.CloseResponse:
        """Closes episodes, and every episode that the Open calls named `request_ids`
        opened: their final states, and the ids that were unknown or expired (`not_found`;
        not an error). `close()` closes the client itself."""
        return self._unary("Close", env_pb2.CloseRequest(episode_ids=list(episode_ids),
                                                         request_ids=list(request_ids)),
                           timeout_s)

    def tasks(self) -> list[env_pb2.TaskInfo]:
        """The tasks this service opens."""
        return list(self._unary("ListTasks", env_pb2.ListTasksRequest()).tasks)
