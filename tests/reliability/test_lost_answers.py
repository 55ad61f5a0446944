"""Episodes of a failed request are closed, even when the env's answer was
lost and the replica never learnt their ids.

A real env service and a replica that reaches it through a TCP proxy; the proxy then
drops every byte from the env to the replica (a one-way partition: requests arrive, the
env applies them, no answer comes back: what a connection closed at its maximum age or a
lost reply does to one call). The replica's Open hits its deadline after the env opened
the group's episodes; the group fails UNAVAILABLE; the replica closes the episodes by the
Open's request id (`CloseRequest.request_ids`), so the env holds none of them, instead of
holding them until their 10-minute TTL.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import grpc
import pytest

from rlfleet.local.procs import Proc
from tests.reliability.conftest import Fleet, group, metric_value, stream_code, wait_until

OPENED = ("rlfleet_grpc_requests_total",
          'grpc_code="OK",grpc_method="Open",grpc_service="rlfleet.v1.EnvService"')


class OneWayProxy:
    """Forwards TCP connections to `port`; while `drop_answers` is set, the bytes coming
    back from the server are dropped."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.drop_answers = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, None),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.drop_answers),
                             daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, drop: threading.Event | None) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if drop is None or not drop.is_set():
                    dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()


@contextlib.contextmanager
def proxy_to(env: Proc) -> Iterator[OneWayProxy]:
    proxy = OneWayProxy(env.extra["port"])
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.mark.slow
def test_episodes_whose_open_answer_was_lost_are_closed(fleet: Fleet) -> None:
    env = fleet.start_env("env")
    port = env.extra["metrics_port"]
    with proxy_to(env) as proxy:
        (replica,) = fleet.start_replicas(["r1"], env_address=proxy.address, fleet_store=False,
                                          env={"RLFLEET_ENV_TIMEOUT_S": "2"})
        code, got, details = stream_code(replica.address or "", group(seed=1_000_900, g=2))
        assert code == grpc.StatusCode.OK and len(got) == 2, details
        wait_until("the env holds no episode",
                   lambda: metric_value(port, "rlfleet_env_open_episodes") == 0, timeout_s=30)
        opened = metric_value(port, *OPENED)

        proxy.drop_answers.set()
        code, got, details = stream_code(replica.address or "", group(seed=1_000_901, g=4))
        assert code == grpc.StatusCode.UNAVAILABLE and not got, details
        assert "DEADLINE_EXCEEDED" in details, details
        # the env did open the group's episodes (4 per attempt: the test's client re-sends
        # an UNAVAILABLE group): only its answers were lost...
        assert metric_value(port, *OPENED) > opened
        # ...and holds none of them: closed by the Open's request id (its TTL is 600 s)
        wait_until("the episodes of the lost Open closed",
                   lambda: metric_value(port, "rlfleet_env_open_episodes") == 0, timeout_s=60)

        proxy.drop_answers.clear()
        wait_until("a group plays again", lambda: stream_code(
            replica.address or "", group(seed=1_000_902, g=2))[0] == grpc.StatusCode.OK,
            timeout_s=120)
    wait_until("the env holds no episode",
               lambda: metric_value(port, "rlfleet_env_open_episodes") == 0, timeout_s=30)
    assert "Traceback" not in replica.log_path.read_text()
