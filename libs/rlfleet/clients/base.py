"""What every typed service client shares: the transport (`rlfleet.rpc.client.RpcClient`:
deadlines, the channel's retry policy for the service's idempotent methods, failing over
between addresses) and the one place where a failed call becomes a typed error
(`rlfleet.rpc.errors.from_grpc`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import grpc

from rlfleet.rpc.client import RpcClient
from rlfleet.rpc.errors import from_grpc


class ServiceClient:
    """One service at one address (or several, tried in turn for retried methods).

    A subclass names its proto service (`SERVICE`), its generated stub (`STUB`) and the
    methods that are safe to re-send when the answer was UNAVAILABLE (`IDEMPOTENT`).
    Every method raises `rlfleet.rpc.errors.RpcError` subclasses, never grpc.RpcError.
    """

    SERVICE: ClassVar[str]
    STUB: ClassVar[type]
    IDEMPOTENT: ClassVar[frozenset[str]]
    # Whether an idempotent call to a single address waits, within its deadline, for a peer
    # that is not up yet (connection refused) instead of failing at once.
    WAIT_FOR_READY: ClassVar[bool] = False

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        tls: dict[str, Path] | None = None,
        max_attempts: int = 4,
    ) -> None:
        self.transport = RpcClient(address, service=self.SERVICE, idempotent=self.IDEMPOTENT,
                                   token=token, timeout_s=timeout_s, tls=tls,
                                   max_attempts=max_attempts,
                                   wait_for_ready=self.WAIT_FOR_READY)

    @property
    def address(self) -> str:
        """The address called (all of them, comma-separated, when there are several)."""
        return ",".join(self.transport.addresses)

    def _method(self, method: str) -> str:
        return f"/{self.SERVICE}/{method}"

    def _unary(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        try:
            return self.transport.call(self.STUB, method, request, timeout_s=timeout_s)
        except grpc.RpcError as err:
            raise from_grpc(err, peer=self.address, method=self._method(method)) from err

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
