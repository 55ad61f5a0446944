"""Proving a call comes from the fleet without sending the fleet's secret.

A client used to send `authorization: Bearer <token>`: any server it called (a replica
listed in Redis by whoever can write there, a service behind a hijacked address) learnt
the token and could then call every service of the fleet. Clients now send a per-call
proof instead:

    authorization: RLFleet-Proof t=<unix seconds>,n=<nonce>,m=<hex HMAC-SHA256>

the MAC, under a key derived from the token (never the token itself), over the full
method name, the time and the nonce. A server with the token checks the MAC and that the
time is within `WINDOW_S` of its own clock. What a peer learns from a proof is that one
call: it can replay it, to the same method, within the window, and nothing else; the
secret is never revealed. (No nonce cache: gRPC re-sends a call's headers unchanged on a
retry, which a cache would refuse.) Servers still accept a bearer token, for tools such
as grpcurl; rlfleet's own clients never send one.

The proof goes both ways. A fleet server answers a proven call with its own proof in the
response headers,

    rlfleet-answer-proof: <hex HMAC-SHA256>

under another key derived from the token, over the method and the caller's proof (so over
the caller's fresh nonce): only a holder of the token can make it, and it is good for
that one call only. rlfleet's clients refuse an answer without it (UNAUTHENTICATED): a
process that took over a replica's port, or an address planted in Redis, can neither
learn the token nor have its answers (a rollout group with reward 10.0) accepted.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

SCHEME = "RLFleet-Proof"
# How far a proof's time may be from the server's clock (either way): covers clock skew
# between machines and a call's time in queues; it is also how long a captured proof
# can be replayed (to the same method).
WINDOW_S = 60.0


def proof_key(token: str) -> bytes:
    """The key proofs are made with: derived from the token, for this use only (the
    fleet store's signing key is another derivation)."""
    return hmac.new(token.encode(), b"rlfleet/call-proof/v1", hashlib.sha256).digest()


def _mac(key: bytes, method: str, at: str, nonce: str) -> str:
    return hmac.new(key, f"{method}\0{at}\0{nonce}".encode(), hashlib.sha256).hexdigest()


def make_proof(key: bytes, method: str, now: float | None = None) -> str:
    """The `authorization` value proving a call to `method` ("/pkg.Service/Method")."""
    at = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(8)
    return f"{SCHEME} t={at},n={nonce},m={_mac(key, method, at, nonce)}"


def check_proof(key: bytes, value: str, method: str, now: float | None = None) -> bool:
    """Whether `value` (an `authorization` header) proves a call to `method` now."""
    scheme, _, rest = value.partition(" ")
    if scheme != SCHEME:
        return False
    try:
        fields = dict(part.split("=", 1) for part in rest.split(","))
        at, nonce, mac = fields["t"], fields["n"], fields["m"]
        when = float(at)
    except (KeyError, ValueError):
        return False
    if not abs((time.time() if now is None else now) - when) <= WINDOW_S:
        return False
    return hmac.compare_digest(mac, _mac(key, method, at, nonce))


ANSWER_HEADER = "rlfleet-answer-proof"


def answer_key(token: str) -> bytes:
    """The key a server proves its answers with: another derivation of the token."""
    return hmac.new(token.encode(), b"rlfleet/answer-proof/v1", hashlib.sha256).digest()


def make_answer(key: bytes, method: str, call_proof: str) -> str:
    """The `ANSWER_HEADER` value for the call to `method` that `call_proof` proved."""
    return hmac.new(key, f"{method}\0{call_proof}".encode(), hashlib.sha256).hexdigest()


def check_answer(key: bytes, value: str, method: str, call_proof: str) -> bool:
    """Whether `value` (the answer's header) proves the answer to that call."""
    return hmac.compare_digest(value, make_answer(key, method, call_proof))
