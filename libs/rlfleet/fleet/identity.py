"""Proof of identity for what the fleet store holds: Redis is a hint, identity is proven.

Anyone who can write to Redis can write a replica heartbeat or an acknowledgement. So
every writer that holds the fleet's shared token signs what it writes with a key derived
from that token (HMAC-SHA256); the token and the key never go to Redis. A reader that
holds the token too accepts only what verifies. A heartbeat's signature covers the whole
document (replica id, address, run, adapter version and sha256, capacity, load) plus the
time it was signed and its TTL, so it cannot be moved to another address, replayed after
its TTL, or edited.

Without a token (auth explicitly off) nothing is signed or checked: the fleet then trusts
whoever can write to Redis, as before.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

CLOCK_SKEW_S = 5.0  # how far writers' and readers' clocks may disagree
MAX_TTL_S = 600.0  # a signed heartbeat is never honoured longer than this


def fleet_signing_key(token: str | None) -> bytes | None:
    """The fleet store's signing key derived from the fleet token (None: auth is off)."""
    if not token:
        return None
    # the label predates the package's name; kept so every version derives the same key
    return hmac.new(token.encode(), b"rlfleet/registry/v1", hashlib.sha256).digest()


def _mac(key: bytes, payload: bytes) -> str:
    return hmac.new(key, payload, hashlib.sha256).hexdigest()


def canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in doc.items() if k != "mac"}, sort_keys=True,
                      separators=(",", ":")).encode()


def sign_document(key: bytes, doc: dict[str, Any], ttl_s: float,
                  now: float | None = None) -> dict[str, Any]:
    """`doc` with `signed_at`, `ttl_s` and `mac` set."""
    signed = {**doc, "signed_at": time.time() if now is None else now, "ttl_s": float(ttl_s)}
    signed.pop("mac", None)
    signed["mac"] = _mac(key, b"heartbeat\0" + canonical(signed))
    return signed


def verify_document(key: bytes, doc: dict[str, Any], now: float | None = None) -> str | None:
    """None if `doc` is authentic and fresh, else why not."""
    mac = doc.get("mac")
    if not isinstance(mac, str) or not mac:
        return "unsigned"
    if not hmac.compare_digest(mac, _mac(key, b"heartbeat\0" + canonical(doc))):
        return "bad signature"
    try:
        signed_at, ttl = float(doc.get("signed_at", 0)), float(doc.get("ttl_s", 0))
    except (TypeError, ValueError):
        return "bad signature time"
    now = time.time() if now is None else now
    if signed_at > now + CLOCK_SKEW_S:
        return "signed in the future"
    if now - signed_at > min(max(ttl, 0.0), MAX_TTL_S) + CLOCK_SKEW_S:
        return "stale (signed longer ago than its TTL)"
    return None


def sign_ack(key: bytes, run: str, version: int, replica_id: str, at: float) -> str:
    return _mac(key, f"ack\0{run}\0{version}\0{replica_id}\0{at!r}".encode())


def verify_ack(key: bytes, run: str, version: int, replica_id: str, at: float,
               mac: str) -> bool:
    return hmac.compare_digest(mac, sign_ack(key, run, version, replica_id, at))
