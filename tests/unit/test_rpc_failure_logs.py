"""A failed call is logged once, by the server, with its grpc_service, grpc_method and
code: a refused request, an unhandled error (with its traceback, never sent to the
caller), a missing token, a request that never arrives. A successful call logs nothing."""

from __future__ import annotations

import logging

import grpc
import pytest

from rlfleet.v1 import env_pb2_grpc
from tests.unit.test_rpc import SERVICE, _header_only, make_server, open_request


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "rlfleet.rpc.interceptors"]


def open_call(address: str, task: str, metadata: tuple = ()) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        try:
            env_pb2_grpc.EnvServiceStub(channel).Open(open_request(task), timeout=10,
                                                      metadata=metadata or None)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(("task", "code", "level"), [
    ("missing", grpc.StatusCode.NOT_FOUND, logging.WARNING),
    ("invalid", grpc.StatusCode.INVALID_ARGUMENT, logging.WARNING),
    ("boom", grpc.StatusCode.INTERNAL, logging.ERROR),
])
def test_a_failed_call_is_logged_once_with_its_method_and_code(
        caplog: pytest.LogCaptureFixture, task: str, code: grpc.StatusCode, level: int) -> None:
    caplog.set_level(logging.INFO, logger="rlfleet.rpc.interceptors")
    srv, _ = make_server()
    try:
        assert open_call(srv.address, "") == grpc.StatusCode.OK
        assert failures(caplog) == []  # success is counted, not logged
        assert open_call(srv.address, task) == code
    finally:
        srv.stop(0)
    (record,) = failures(caplog)
    assert (record.grpc_service, record.grpc_method, record.grpc_code) == (
        SERVICE, "Open", code.name)
    assert record.levelno == level
    if code == grpc.StatusCode.INTERNAL:  # the traceback stays in the server's log
        assert record.exc_info and "secret internal detail" in str(record.exc_info[1])
        assert record.details == "internal error (RuntimeError)"
    else:
        assert record.exc_info is None and record.details


def test_refusals_at_the_headers_are_logged_once_too(caplog: pytest.LogCaptureFixture
                                                     ) -> None:
    caplog.set_level(logging.INFO, logger="rlfleet.rpc.interceptors")
    srv, _ = make_server(request_timeout_s=0.5, auth_token="s3cret-token")
    try:
        assert open_call(srv.address, "", (("authorization", "Bearer wrong"),)) == \
            grpc.StatusCode.UNAUTHENTICATED
        call, release, channel = _header_only(
            srv.address, f"/{SERVICE}/Open", (("authorization", "Bearer s3cret-token"),))
        with pytest.raises(grpc.RpcError) as err:
            call.result(timeout=10)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        release.set()
        channel.close()
    finally:
        srv.stop(0)
    assert [(r.grpc_method, r.grpc_code) for r in failures(caplog)] == [
        ("Open", "UNAUTHENTICATED"), ("Open", "DEADLINE_EXCEEDED")]
