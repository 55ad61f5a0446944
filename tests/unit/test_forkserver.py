"""The fork server (rlfleet.local.forkserver): its children are the processes `python -m`
would start (argv, environment, working directory, log, session, exit status), and a
ProcessGroup given one serves a real service from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.local.forkserver import FORKSERVER_ENV, ForkedProcess, ForkServer, popen
from rlfleet.local.procs import ProcessGroup, free_port, rlfleet_argv
from rlfleet.rpc.health import check
from tests.waits import SCALE, scaled

PROBE = '''
import os, sys, time
print("argv", sys.argv[1:])
print("cwd", os.getcwd())
print("env", os.environ.get("PROBE_VALUE"))
print("own session", os.getsid(0) == os.getpid())
print("torch preloaded", "torch" in sys.modules)
print("path", sys.path[1])
sys.stdout.flush()
if sys.argv[1] == "sleep":
    time.sleep(600)
raise SystemExit(int(sys.argv[1]))
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    root = tmp_path_factory.mktemp("forkserver")
    server = ForkServer.start(root / "fs.sock", root / "fs.log", timeout_s=scaled(120))
    yield server
    server.close()
    assert server.process is not None and server.process.returncode is not None


def spawn_probe(server: ForkServer, tmp_path: Path, *args: str) -> tuple[ForkedProcess, Path]:
    (tmp_path / "probe_mod.py").write_text(PROBE)
    log = tmp_path / "probe.log"
    with open(log, "ab") as out:
        child = server.spawn([sys.executable, "-m", "probe_mod", *args],
                             {**os.environ, "PROBE_VALUE": "from-the-caller",
                              "PYTHONPATH": str(tmp_path / "extra")}, tmp_path,
                             out.fileno())
    return child, log


def test_a_child_runs_as_python_dash_m_would(server: ForkServer, tmp_path: Path) -> None:
    child, log = spawn_probe(server, tmp_path, "3", "x y")
    assert child.wait(scaled(60)) == 3 and child.poll() == 3
    out = log.read_text()
    assert "argv ['3', 'x y']" in out
    assert f"cwd {tmp_path}" in out
    assert "env from-the-caller" in out
    assert "own session True" in out
    assert "torch preloaded True" in out  # what the server is for
    assert f"path {tmp_path / 'extra'}" in out  # the caller's PYTHONPATH, after cwd


def test_a_signalled_child_reports_the_signal(server: ForkServer, tmp_path: Path) -> None:
    child, log = spawn_probe(server, tmp_path, "sleep")
    assert child.poll() is None
    with pytest.raises(Exception, match="timed out"):
        child.wait(0.2)
    os.killpg(child.pid, signal.SIGKILL)  # as ProcessGroup.kill does
    assert child.wait(scaled(30)) == -signal.SIGKILL
    child.send_signal(signal.SIGTERM)  # a no-op once ended, as for Popen


def test_captured_output_comes_whole_through_communicate(
        server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORKSERVER_ENV, str(server.socket_path))
    (tmp_path / "probe_mod.py").write_text(PROBE)
    child = popen([sys.executable, "-m", "probe_mod", "sleep"], cwd=tmp_path)
    assert isinstance(child, ForkedProcess)
    with pytest.raises(subprocess.TimeoutExpired):
        child.communicate(timeout=0.5)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=scaled(30))
    assert "argv ['sleep']" in out and "torch preloaded True" in out  # nothing lost
    assert err is None and child.returncode == -signal.SIGTERM
    child = popen([sys.executable, "-m", "probe_mod", "0"], cwd=tmp_path)
    assert child.communicate(timeout=scaled(60))[0].count("argv") == 1
    assert child.returncode == 0


def test_another_interpreter_is_started_plainly(
        server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller in another venv (the vLLM tier's pytest) inherits the variable: its
    processes must run on its own interpreter, not the server's."""
    monkeypatch.setenv(FORKSERVER_ENV, str(server.socket_path))
    other = Path(sys.executable).resolve()  # the same interpreter, by another path
    assert str(other) != sys.executable or pytest.skip("no second path to the interpreter")
    with open(tmp_path / "out", "wb") as out:
        assert server.spawn([str(other), "-m", "json.tool"], dict(os.environ), tmp_path,
                            out.fileno()) is None
    child = popen([str(other), "-c", "import sys; print(sys.executable)"])
    assert not isinstance(child, ForkedProcess)
    assert child.communicate(timeout=scaled(60))[0].strip() == str(other)
    # nor settings the interpreter reads only at its start
    with open(tmp_path / "out", "wb") as out:
        assert server.spawn([sys.executable, "-m", "json.tool"],
                            {**os.environ, "PYTHONHASHSEED": "7"}, tmp_path,
                            out.fileno()) is None


def test_settings_read_after_start_do_not_stop_the_server(
        server: ForkServer, tmp_path: Path) -> None:
    """ray.init sets PYTHONBREAKPOINT in its driver, the pytest worker where a test runs
    Ray in-process: every later child of that worker must still fork, and see it."""
    (tmp_path / "bp_mod.py").write_text(
        "import os, sys\nprint('hook', os.environ['PYTHONBREAKPOINT'])\n"
        "print('torch preloaded', 'torch' in sys.modules)\n")
    with open(tmp_path / "out", "wb") as out:
        child = server.spawn([sys.executable, "-m", "bp_mod"],
                             {**os.environ, "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace"},
                             tmp_path, out.fileno())
    assert isinstance(child, ForkedProcess) and child.wait(scaled(60)) == 0
    out = (tmp_path / "out").read_text()
    assert "hook ray.util.rpdb.set_trace" in out and "torch preloaded True" in out


def test_a_process_group_serves_a_service_from_the_server(
        server: ForkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORKSERVER_ENV, str(server.socket_path))
    port = free_port()
    with ProcessGroup(tmp_path / "logs", wait_scale=SCALE) as group:
        proc = group.start_service(
            "env", rlfleet_argv("env", "serve", "--port", str(port), "--metrics-port",
                                str(free_port())), f"127.0.0.1:{port}")
        assert isinstance(proc.popen, ForkedProcess)
        assert check(f"127.0.0.1:{port}", "", timeout_s=scaled(5)) == "SERVING"
        assert group.stop(proc) == 0  # SIGTERM: drained and exited cleanly
    assert '"msg": "stopped"' in proc.log_path.read_text()


def test_without_the_server_a_process_group_uses_popen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FORKSERVER_ENV, raising=False)
    with ProcessGroup(tmp_path / "logs") as group:
        proc = group.start("probe", [sys.executable, "-c", "print('plain')"])
        assert not isinstance(proc.popen, ForkedProcess)
        assert proc.popen.wait(scaled(60)) == 0
