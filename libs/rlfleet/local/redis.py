"""A real Redis server on loopback for local runs and tests."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rlfleet.local.procs import Proc, ProcessGroup, free_port


def redis_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError(
            "redis-server not found; `make setup` installs it (scripts/setup_system.sh)"
        )
    return path


def start_redis(
    group: ProcessGroup, *, port: int | None = None, password: str | None = None,
    data_dir: Path | None = None, name: str = "redis",
) -> tuple[Proc, str]:
    """Starts redis-server and returns (process, redis:// URL)."""
    import redis as redis_client

    port = port or free_port()
    data_dir = Path(data_dir or group.log_dir / name)
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(data_dir)]
    if password:
        argv += ["--requirepass", password]
    proc = group.start(name, argv)
    url = f"redis://{':' + password + '@' if password else ''}127.0.0.1:{port}/0"
    client = redis_client.Redis.from_url(url)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis_client.ConnectionError:
            if not proc.alive or time.monotonic() > deadline:
                raise RuntimeError(f"redis did not start:\n{proc.log_tail()}") from None
            time.sleep(0.05)
    client.close()
    proc.address = f"127.0.0.1:{port}"
    return proc, url
