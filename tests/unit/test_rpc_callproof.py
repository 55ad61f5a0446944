"""The fleet's token never goes to a peer, and a peer that is not the fleet's has nothing
accepted: rlfleet's clients prove each call with a MAC and take an
answer only with the server's proof for that call (`rlfleet.rpc.callproof`), over real
gRPC on loopback.

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
from rlfleet.rpc.callproof import (
    ANSWER_HEADER,
    WINDOW_S,
    answer_key,
    check_answer,
    check_proof,
    make_proof,
    proof_key,
)
from rlfleet.v1 import env_pb2, env_pb2_grpc, rollout_pb2, rollout_pb2_grpc
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
        # the rogue's answer is refused: it could not prove it holds the token
        with pytest.raises(grpc.RpcError) as err:
            RpcClient(f"127.0.0.1:{port}", token=TOKEN).call(
                env_pb2_grpc.EnvServiceStub, "Open", open_request())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "did not prove it belongs to the fleet" in err.value.details()
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


class RogueReplica(rollout_pb2_grpc.RolloutServiceServicer):
    """What took over a replica's port: answers as a replica would, with a reward of 10."""

    def RolloutGroup(self, request, context):  # noqa: N802, ANN001, ANN201
        yield rollout_pb2.Trajectory(idempotency_key=request.idempotency_key, reward=10.0)

    def GetStatus(self, request, context):  # noqa: N802, ANN001, ANN201
        return rollout_pb2.ReplicaStatus(replica_id="rollout-0")


def test_a_port_taken_over_answers_nothing_the_fleet_accepts() -> None:
    rogue = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(RogueReplica(), rogue)
    port = rogue.add_insecure_port("127.0.0.1:0")
    rogue.start()
    try:
        client = RpcClient(f"127.0.0.1:{port}", token=TOKEN)
        stub = rollout_pb2_grpc.RolloutServiceStub
        with pytest.raises(grpc.RpcError) as err:  # the pool's probe
            client.call(stub, "GetStatus", rollout_pb2.StatusRequest())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:  # the pool's group: not one trajectory
            list(client.stream(stub, "RolloutGroup",
                               rollout_pb2.GroupRequest(idempotency_key="k", group_size=1)))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # without the token (auth off), nothing is proven and nothing is checked
        assert list(RpcClient(f"127.0.0.1:{port}").stream(
            stub, "RolloutGroup", rollout_pb2.GroupRequest(idempotency_key="k")))[0].reward \
            == 10.0
    finally:
        rogue.stop(0)


def test_the_fleets_answers_carry_a_proof_for_that_call_only() -> None:
    fleet, _ = make_server(auth_token=TOKEN)
    try:
        client = RpcClient(fleet.address, token=TOKEN)
        assert client.call(env_pb2_grpc.EnvServiceStub, "Open", open_request()).episodes
        # a client with another token is refused at the fleet's door, not answered
        with pytest.raises(grpc.RpcError) as err:
            RpcClient(fleet.address, token="another token").call(
                env_pb2_grpc.EnvServiceStub, "Open", open_request())
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # the answer's proof is bound to the call's own proof (its fresh nonce)
        proof = make_proof(proof_key(TOKEN), OPEN)
        stub = env_pb2_grpc.EnvServiceStub(grpc.insecure_channel(fleet.address))
        _, call = stub.Open.with_call(open_request(), metadata=(("authorization", proof),),
                                      timeout=10)
        answer = dict(call.initial_metadata())[ANSWER_HEADER]
        assert check_answer(answer_key(TOKEN), answer, OPEN, proof)
        assert not check_answer(answer_key(TOKEN), answer, OPEN,
                                make_proof(proof_key(TOKEN), OPEN))
        assert not check_answer(answer_key("a guess"), answer, OPEN, proof)
    finally:
        fleet.stop(0)
