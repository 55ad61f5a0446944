"""The fleet's token never goes to a peer (issue 23 item 1): rlfleet's clients prove each
call with a MAC (`rlfleet.rpc.callproof`), over real gRPC on loopback.

A peer that is not the fleet's (a plain gRPC server recording every header, as a replica
address planted in Redis would be) learns no token from a client that holds one; a proof
it captured is refused for another method, and once it is older than the window; a
fleet server accepts the client's proofs (and a bearer token, for tools)."""

from __future__ import annotations

import time
from concurrent import futures

import grpc
import pytest

from rlfleet.rpc import RpcClient
from rlfleet.rpc.callproof import WINDOW_S, check_proof, make_proof, proof_key
from rlfleet.v1 import env_pb2, env_pb2_grpc
from tests.unit.test_rpc import make_server, open_request

TOKEN = "s3cret-fleet-token"
OPEN = "/rlfleet.v1.EnvService/Open"


class Recorder(env_pb2_grpc.EnvServiceServicer):
    """A peer that is not the fleet's: answers, and keeps every header it was sent."""

    def __init__(self) -> None:
        self.headers: list[tuple[str, str]] = []

    def Open(self, request, context):  # noqa: N802, ANN001, ANN201
        self.headers += [(k, str(v)) for k, v in context.invocation_metadata()]
        return env_pb2.OpenResponse()


def test_a_peer_learns_no_token_and_its_captured_proofs_are_refused() -> None:
    recorder = Recorder()
    rogue = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    env_pb2_grpc.add_EnvServiceServicer_to_server(recorder, rogue)
    port = rogue.add_insecure_port("127.0.0.1:0")
    rogue.start()
    fleet, _ = make_server(auth_token=TOKEN)
    try:
        RpcClient(f"127.0.0.1:{port}", token=TOKEN).call(
            env_pb2_grpc.EnvServiceStub, "Open", open_request())
        (proof,) = [v for k, v in recorder.headers if k == "authorization"]
        assert TOKEN not in proof and not proof.startswith("Bearer")
        assert all(TOKEN not in v for _, v in recorder.headers)

        def call(metadata: tuple, method: str = "Open") -> grpc.StatusCode:
            stub = env_pb2_grpc.EnvServiceStub(grpc.insecure_channel(fleet.address))
            request = open_request() if method == "Open" else env_pb2.CloseRequest()
            try:
                getattr(stub, method)(request, metadata=metadata, timeout=10)
            except grpc.RpcError as err:
                return err.code()
            return grpc.StatusCode.OK

        # the captured proof works for its own method within the window (the replay
        # that remains), never for another method
        assert call((("authorization", proof),)) == grpc.StatusCode.OK
        assert call((("authorization", proof),), "Close") == grpc.StatusCode.UNAUTHENTICATED
        old = make_proof(proof_key(TOKEN), OPEN, now=time.time() - 2 * WINDOW_S)
        assert call((("authorization", old),)) == grpc.StatusCode.UNAUTHENTICATED
        forged = make_proof(proof_key("a guess"), OPEN)
        assert call((("authorization", forged),)) == grpc.StatusCode.UNAUTHENTICATED
        # the fleet's clients and tools with the bearer token are served
        assert RpcClient(fleet.address, token=TOKEN).call(
            env_pb2_grpc.EnvServiceStub, "Open", open_request()).episodes
        assert call((("authorization", f"Bearer {TOKEN}"),)) == grpc.StatusCode.OK
    finally:
        rogue.stop(0)
        fleet.stop(0)


@pytest.mark.parametrize("value", ["", "RLFleet-Proof", "RLFleet-Proof t=x,n=1,m=2",
                                   "RLFleet-Proof n=1,m=2", "Bearer x"])
def test_malformed_proofs_are_refused(value: str) -> None:
    assert not check_proof(proof_key(TOKEN), value, OPEN)
