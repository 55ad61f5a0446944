"""`rlfleet learner submit|logs|status|stop` against a real Ray head with its job server
(`ray start --head --include-dashboard=true`), token auth on as Ray 2.60 has it.

The submitted entrypoint is the real `rlfleet learner run`: a config that fails validation
ends the job FAILED with pydantic's message in its logs; a valid one, against a real Redis
and asking for a GPU the CPU-only head lacks, stays RUNNING in its start (waiting for the
GPU), where the fleet token is checked in the learner process's environment, and `stop`
ends it. The token reaches the job without showing in its entrypoint, its runtime_env or
`ray job list`.

The head runs in a short temp dir with its own Ray token file (RAY_AUTH_TOKEN_PATH), so the
user's ~/.ray is not touched. Teardown ends exactly the processes this head started (found
by a marker in their environment, inherited by the job's processes too): `ray stop` would
end every Ray on the machine, other sessions' included.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rlfleet.local.marks import marked
from rlfleet.local.procs import free_port, rlfleet_argv
from rlfleet_learner.ray_start import start_with_retry
from tests.console import assert_readable_log
from tests.waits import scaled

pytestmark = pytest.mark.slow

MARKER = "RLFLEET_TEST_RAY_HEAD"
FLEET_TOKEN = "fleet-" + secrets.token_hex(16)


@dataclass
class Head:
    address: str
    ray_token_file: Path
    root: Path


def _marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries MARKER=marker: the head and all it started."""
    return [proc.pid for proc in marked(MARKER, marker)]


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _stop_head(marker: str) -> list[int]:
    """SIGTERM, then SIGKILL after a grace period; returns what is still alive after."""
    _signal_all(_marked_pids(marker), signal.SIGTERM)
    deadline = time.monotonic() + scaled(20)
    while _marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    _signal_all(_marked_pids(marker), signal.SIGKILL)
    deadline = time.monotonic() + scaled(10)
    while _marked_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _marked_pids(marker)


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    # short: Ray's unix socket paths live under --temp-dir (107-byte limit)
    root = Path(tempfile.mkdtemp(prefix="rlray-", dir="/tmp"))
    ray_token_file = root / "ray_token"
    ray_token_file.write_text(secrets.token_hex(32))
    try:
        # `ray start` times out as ray.init does on a busy machine: retried the same way
        address = start_with_retry(lambda: _start_head(root, ray_token_file))
        yield Head(address, ray_token_file, root)
    finally:
        left = _stop_head(root.name)
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"processes of the test's Ray head still alive: {left}"


def _start_head(root: Path, ray_token_file: Path) -> str:
    """`ray start --head` with its job server; returns the job server's address."""
    dashboard_port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLFLEET_AUTH", "RAY_ADDRESS"))}
    env.update({
        MARKER: root.name,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(ray_token_file),
        # the job's entrypoint finds `rlfleet` on PATH, as in the cluster's image
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    argv = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
            "--port", str(free_port()), "--dashboard-port", str(dashboard_port),
            "--dashboard-host", "127.0.0.1", "--include-dashboard=true",
            "--ray-client-server-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
            "--num-cpus", "1", "--object-store-memory", str(100 * 1024 * 1024),
            "--temp-dir", str(root / "ray"), "--disable-usage-stats"]
    log = open(root / "head.log", "wb")  # noqa: SIM115 - the head's for its lifetime
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
                            start_new_session=True)
    log.close()
    address = f"http://127.0.0.1:{dashboard_port}"
    _wait_for_job_server(address, proc, root)
    return address


def _wait_for_job_server(address: str, proc: subprocess.Popen, root: Path) -> None:
    import requests

    auth = {"Authorization": f"Bearer {(root / 'ray_token').read_text()}"}

    deadline = time.monotonic() + scaled(180)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited {proc.returncode}:\n"
                               f"{(root / 'head.log').read_text()[-3000:]}")
        try:
            if requests.get(f"{address}/api/jobs/", headers=auth, timeout=5).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    pytest.fail(f"the job server at {address} never answered")


def rlfleet(*args: str, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(rlfleet_argv("learner", *args), capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def remote(head: Head) -> list[str]:
    return ["--address", head.address, "--ray-token-file", str(head.ray_token_file)]


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def submit(head: Head, config: Path, token_file: Path, *extra: str
           ) -> subprocess.CompletedProcess:
    return rlfleet("submit", *remote(head), "--config", str(config),
                   "--token-file", str(token_file), *extra)


def ray_job_list(head: Head) -> str:
    out = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "list",
                          "--address", head.address], capture_output=True, text=True,
                         env={**os.environ, "RAY_AUTH_MODE": "token",
                              "RAY_AUTH_TOKEN_PATH": str(head.ray_token_file)}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def job_info(head: Head, job_id: str) -> dict:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head.address, headers={
        "Authorization": f"Bearer {head.ray_token_file.read_text()}"})
    return json.loads(client.get_job_info(job_id).model_dump_json())


def assert_token_hidden(head: Head, job_id: str, *outputs: str) -> None:
    info = job_info(head, job_id)
    assert FLEET_TOKEN not in json.dumps(info)  # entrypoint, runtime_env, metadata
    assert info["entrypoint"].startswith("rlfleet learner run --config learner.yaml")
    assert FLEET_TOKEN not in ray_job_list(head)
    for text in outputs:
        assert FLEET_TOKEN not in text


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    return write(tmp_path / "fleet.token", FLEET_TOKEN + "\n")


def test_an_invalid_config_fails_in_the_job_with_the_validation_error(
        head: Head, tmp_path: Path, token_file: Path) -> None:
    # the chart's old built-in config: `model` a string where a mapping belongs
    config = write(tmp_path / "bad.yaml", {"run": "r", "model": "/shared/models/tiny"})
    out = submit(head, config, token_file, "--wait")
    assert out.returncode == 1, out.stderr
    job_id = out.stdout.strip()
    assert job_id.startswith("raysubmit_") and "\n" not in job_id  # the id alone
    assert "invalid learner configuration" in out.stderr  # the job's logs, followed
    logs = rlfleet("logs", job_id, *remote(head))
    assert logs.returncode == 0 and "invalid learner configuration" in logs.stdout
    assert "model" in logs.stdout
    followed = rlfleet("logs", job_id, *remote(head), "--follow")  # ends with the job
    assert followed.returncode == 0 and "invalid learner configuration" in followed.stdout
    status = rlfleet("status", job_id, *remote(head))
    assert status.returncode == 0 and status.stdout.strip() == "FAILED"
    assert_token_hidden(head, job_id, out.stdout, out.stderr, logs.stdout, status.stdout,
                        status.stderr)


def _learner_process(marker: str, deadline_s: float) -> int:
    """The pid of the job's `rlfleet learner run` process."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for pid in _marked_pids(marker):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"learner" in argv and b"run" in argv and any(b"rlfleet" in a for a in argv):
                return pid
        time.sleep(0.5)
    pytest.fail("the job's learner process never appeared")


def _connections(client) -> int:  # noqa: ANN001 - a redis.Redis
    """Connections Redis has accepted so far (this client's one, kept open, included)."""
    return int(client.info("stats")["total_connections_received"])


def test_the_token_reaches_the_learner_and_stop_ends_the_job(
        head: Head, tmp_path: Path, token_file: Path, redis_url: str,
        tiny_model_dir: Path) -> None:
    config = write(tmp_path / "learner.yaml", {
        "run": "submitted",
        "model": {"profile": "tiny", "path": str(tiny_model_dir), "lora_rank": 4},
        "fleet": {"redis_url": redis_url, "runs_root": str(tmp_path / "runs")},
        # a GPU the CPU-only head lacks: the learner waits in its start, after reading the
        # token and connecting to Redis, until stopped
        "ray": {"num_workers": 1, "num_gpus_per_worker": 1, "resources_timeout_s": 3600},
    })
    import redis

    watcher = redis.Redis.from_url(redis_url)
    before = _connections(watcher)
    # the learner waits for its GPU without heeding SIGTERM: Ray kills it after the grace
    out = submit(head, config, token_file, "--run", "submitted", "--stop-grace", "5")
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    pid = _learner_process(head.root.name, deadline_s=180)
    environ = dict(item.split(b"=", 1) for item in
                   Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in item)
    assert b"RLFLEET_AUTH_TOKEN" not in environ  # never in plain env
    assert b"RLFLEET_AUTH" not in environ  # auth stays on
    cwd = Path(os.readlink(f"/proc/{pid}/cwd"))  # the job's unpacked working_dir
    token_path = cwd / environ[b"RLFLEET_AUTH_TOKEN_FILE"].decode()
    assert token_path.read_text() == FLEET_TOKEN
    # the learner got past its token check (it refuses to start without one) to Redis
    deadline = time.monotonic() + scaled(240)
    while _connections(watcher) == before and time.monotonic() < deadline:
        status = rlfleet("status", job_id, *remote(head)).stdout.strip()
        assert status in ("PENDING", "RUNNING"), rlfleet("logs", job_id, *remote(head)).stdout
        time.sleep(2)
    assert _connections(watcher) > before, rlfleet("logs", job_id, *remote(head)).stdout
    assert rlfleet("status", job_id, *remote(head)).stdout.strip() == "RUNNING"

    stopped = rlfleet("stop", job_id, *remote(head))
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "STOPPED"
    assert rlfleet("status", job_id, *remote(head)).stdout.strip() == "STOPPED"
    logs = rlfleet("logs", job_id, *remote(head)).stdout
    assert "no auth token" not in logs
    assert_token_hidden(head, job_id, out.stdout, out.stderr, stopped.stdout, logs)


def test_clear_one_line_errors(head: Head, tmp_path: Path, token_file: Path) -> None:
    config = write(tmp_path / "learner.yaml", {"run": "r"})
    cases = {
        "cannot reach the Ray Jobs API": rlfleet(
            "status", "raysubmit_x", "--address", f"http://127.0.0.1:{free_port()}"),
        "no job raysubmit_nosuchjob": rlfleet("status", "raysubmit_nosuchjob", *remote(head)),
        "refused Ray's token": rlfleet(
            "status", "raysubmit_x", "--address", head.address, "--ray-token-file",
            str(write(tmp_path / "wrong", "not-the-token"))),
        "cannot read learner config": submit(head, tmp_path / "missing.yaml", token_file),
        "cannot read token file": submit(head, config, tmp_path / "missing.token"),
        "no fleet token": rlfleet("submit", *remote(head), "--config", str(config)),
        "must hold a mapping": submit(head, write(tmp_path / "list.yaml", "[1, 2]"),
                                      token_file),
    }
    for expected, out in cases.items():
        assert out.returncode == 2, (expected, out.stdout, out.stderr)
        assert expected in out.stderr and len(out.stderr.strip().splitlines()) == 1, \
            (expected, out.stderr)
        assert out.stdout == ""
    # no --token flag exists: a token is never accepted on the command line
    out = rlfleet("submit", *remote(head), "--config", str(config), "--token", FLEET_TOKEN)
    assert out.returncode == 2 and FLEET_TOKEN not in out.stderr


def test_a_submitted_learner_trains_against_a_fleet_that_requires_the_token(
        head: Head, tmp_path: Path, token_file: Path, procs) -> None:  # noqa: ANN001
    from rlfleet.local.metrics_jsonl import read_events
    from rlfleet.local.stack import start_stack
    from tests.factories import NO_EVAL, learner_config

    # every service of this fleet refuses a call without FLEET_TOKEN: the steps below
    # happen only if the token reached the job's learner
    run = "submitted-train"
    stack = start_stack(tmp_path, runs_root=tmp_path / "runs", run=run, replicas=1,
                        model_dir=Path(__file__).resolve().parents[2] / "warm-starts"
                        / "tiny-sft", group=procs, token=FLEET_TOKEN, log=lambda *_: None)
    config = learner_config(stack, tmp_path, run, steps=2, eval=NO_EVAL,
                            data={"groups_per_step": 2, "group_size": 4},
                            checkpoint={"every": 1000}, ray={"num_workers": 1})
    out = submit(head, config, token_file, "--wait", "--console", "human")
    assert out.returncode == 0, out.stderr[-4000:]
    job_id = out.stdout.strip()
    assert rlfleet("status", job_id, *remote(head)).stdout.strip() == "SUCCEEDED"
    steps = [e for e in read_events(stack.runs_root / run / "metrics.jsonl")
             if e["event"] == "step"]
    assert [s["step"] for s in steps] == [1, 2]
    assert_readable_log(out.stderr, steps=2)
    # the JSON lines are in the run's log file
    log_file = stack.runs_root / run / "logs" / "learner.log"
    assert any(json.loads(line).get("msg") == "step"
               for line in log_file.read_text().splitlines())
    assert all(s["trajectories"] == 2 * 4 for s in steps)
    assert_token_hidden(head, job_id, out.stdout, out.stderr)
