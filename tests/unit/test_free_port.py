"""Local service ports: below the kernel's ephemeral range (where outgoing connections
take their source ports), in a block per test worker, never the same twice in a row, and
never one that something listens on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from rlfleet.local import procs


def test_ports_come_from_this_workers_block_below_the_ephemeral_range() -> None:
    floor = procs._ephemeral_floor()
    block = int(os.environ[procs.PORT_BLOCK_ENV])  # set per worker by tests/conftest.py
    base = procs.PORT_FLOOR + block * procs.PORT_BLOCK_SIZE
    ports = [procs.free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(base <= p < base + procs.PORT_BLOCK_SIZE and p < floor for p in ports)


def test_a_port_in_use_is_skipped() -> None:
    taken = procs.free_port() + 1  # the next candidate, unless the block wraps
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen()
        assert all(procs.free_port() != taken for _ in range(5))


def test_two_workers_blocks_do_not_meet() -> None:
    code = "from rlfleet.local.procs import free_port; print(*[free_port() for _ in range(50)])"
    seen = []
    for block in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env={**os.environ, procs.PORT_BLOCK_ENV: block})
        seen.append(set(map(int, out.stdout.split())))
    assert len(seen[0]) == len(seen[1]) == 50 and not seen[0] & seen[1]
