"""A fork server for local `rlfleet` processes: torch, transformers and peft imported once.

Every replica or learner process spends about 9 CPU-seconds importing torch and
transformers before it does anything (measured on the 2-core machines), and the test suite
starts well over a hundred of them. The fork server is one process that has done those
imports; asked to start `python -m MODULE ARGS` (the launcher's: `-m rlfleet.cli ...`), it
forks, and the child runs the module as the interpreter would (`runpy`, `__main__`, a
session of its own, stdout and stderr to the caller's descriptor, the caller's
environment, working directory and PYTHONPATH), skipping only the imports already done.
What it cannot become it refuses, and the caller starts plainly: another interpreter (a
caller in another venv that inherited the variable) or other start-up settings (PYTHON*).

Only third-party modules are imported beforehand, never rlfleet's: the project's modules
read their environment at import, and must read the caller's. The caller's side is
`popen` (a `subprocess.Popen` where there is no server) and `ForkedProcess`, the part of
`Popen` the launcher and the tests use (pid, poll, wait, returncode, send_signal,
communicate): the server reaps its children and reports each exit status over the
connection that asked for the child.

Opt-in: `popen` (and so `ProcessGroup`) uses a fork server when `FORKSERVER_ENV` names its
socket (the test suite starts one per worker, tests/conftest.py); without it every process
is a plain `subprocess.Popen`.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

FORKSERVER_ENV = "RLFLEET_FORKSERVER"
# the imports worth sharing: ~9 of a replica's ~11 CPU-seconds of start-up
PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "peft", "numpy",
           "PIL.Image")
# environment read by the preloaded libraries at import, set as rlfleet.logs would set it
# before them (huggingface_hub reads its progress-bar switch once, at import)
IMPORT_TIME_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
_MAX_REQUEST = 1 << 20


@dataclass
class _Spawn:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    output: int  # the child's stdout and stderr: a descriptor the caller passed


def _read_request(conn: socket.socket) -> _Spawn:
    """A request: one JSON line, the caller's output descriptor riding on its first part
    (SCM_RIGHTS)."""
    data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
    try:
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk or len(data) > _MAX_REQUEST:
                raise ValueError("incomplete request")
            data += chunk
        if len(fds) != 1:
            raise ValueError("no output descriptor")
        doc = json.loads(data)
        return _Spawn(list(doc["argv"]), dict(doc["env"]), str(doc["cwd"]), fds[0])
    except Exception:
        for fd in fds:
            os.close(fd)
        raise


def _serve(path: str) -> _Spawn | None:
    """The server's loop. Returns in a forked child only (what it is to run); the server
    itself returns None when its parent is gone or on SIGTERM."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _: stopping.append(signum))
    parent = os.getppid()
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while not stopping and os.getppid() == parent:
        ready, _, _ = select.select([listener, wake_r], [], [], 1.0)
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        _reap(children)
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            conn.settimeout(10.0)
            spawn = _read_request(conn)
        except (OSError, ValueError) as exc:
            conn.close()
            print(f"bad request: {exc}", file=sys.stderr, flush=True)
            continue
        refusal = _refusal(spawn)
        if refusal:  # not a process this one can become: the caller starts it itself
            print(f"refused {spawn.argv[1:4]}: {refusal}", file=sys.stderr, flush=True)
            os.close(spawn.output)
            conn.sendall(json.dumps({"refused": refusal}).encode() + b"\n")
            conn.close()
            continue
        pid = os.fork()
        if pid != 0:
            os.close(spawn.output)  # the child's now
        if pid == 0:  # the child: nothing of the server's may stay open in it
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            for fd in (wake_r, wake_w):
                os.close(fd)
            listener.close()
            conn.close()
            for other in children.values():
                other.close()
            return spawn
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        children[pid] = conn
    listener.close()
    return None


# PYTHON* variables a forked child still honours: PYTHONPATH (applied in _become),
# PYTHONUNBUFFERED (the server's own), PYTHONBREAKPOINT (sys.breakpointhook reads it at
# every breakpoint() call). Ray's ray.init sets PYTHONBREAKPOINT in its driver, so a test
# that ran Ray in the pytest worker must not turn the server off for the rest of the run.
_READ_AFTER_START = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONBREAKPOINT"})


def _interpreter_settings(env: dict[str, str]) -> dict[str, str]:
    """The environment the interpreter reads once, at its start (PYTHONHASHSEED,
    PYTHONWARNINGS, ...)."""
    return {k: v for k, v in env.items()
            if k.startswith("PYTHON") and k not in _READ_AFTER_START}


def _refusal(spawn: _Spawn) -> str:
    """Why this server cannot start `spawn` as `python -m` would; empty when it can."""
    if spawn.argv[0] != sys.executable:
        return f"another interpreter than {sys.executable}"
    ours, theirs = _interpreter_settings(_STARTUP_ENV), _interpreter_settings(spawn.env)
    if theirs != ours:
        differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        return f"other interpreter start-up settings ({', '.join(differ)})"
    return ""


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(json.dumps({"status": status}).encode() + b"\n")
            except OSError:
                pass  # the caller is gone; nothing waits for this status
            conn.close()


def _become(spawn: _Spawn) -> None:
    """In the forked child: the process `python -m MODULE ARGS` would be, then run it."""
    os.setsid()  # a session of its own, as ProcessGroup's start_new_session
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(spawn.output, 1)
    os.dup2(spawn.output, 2)
    os.close(spawn.output)
    os.close(null)
    os.chdir(spawn.cwd)
    os.environ.clear()
    os.environ.update(spawn.env)
    module = spawn.argv[2]
    sys.argv = [module, *spawn.argv[3:]]  # runpy puts the module's path in argv[0]
    # sys.path as `python -m` started in cwd with the caller's PYTHONPATH would have it:
    # the working directory, then PYTHONPATH's entries, then the rest (the site's)
    ours = _pythonpath(_STARTUP_ENV)
    rest = [p for p in sys.path[1:] if p not in ours]
    sys.path[:] = [spawn.cwd, *_pythonpath(spawn.env), *rest]
    importlib.invalidate_caches()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _pythonpath(env: dict[str, str]) -> list[str]:
    return [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


_STARTUP_ENV: dict[str, str] = dict(os.environ)


def main(argv: Sequence[str] | None = None) -> None:
    path = (argv if argv is not None else sys.argv[1:])[0]
    for key, value in IMPORT_TIME_ENV.items():
        os.environ.setdefault(key, value)
    for name in PRELOAD:
        importlib.import_module(name)
    spawn = _serve(path)
    if spawn is not None:
        _become(spawn)  # SystemExit and exceptions end the child as they would `python -m`


class ForkServer:
    """The caller's side: asks the server at `socket_path` for children. `start` starts
    a server (and owns it: `close` ends it); `attach` uses one another process started."""

    def __init__(self, socket_path: Path, process: subprocess.Popen | None = None) -> None:
        self.socket_path = Path(socket_path)
        self.process = process

    @classmethod
    def start(cls, socket_path: Path, log_path: Path, timeout_s: float = 120.0) -> ForkServer:
        Path(socket_path).unlink(missing_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 - the server's own output, for its lifetime
        process = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.local.forkserver", str(socket_path)],
            stdout=subprocess.PIPE, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        server = cls(socket_path, process)
        ready, _, _ = select.select([process.stdout], [], [], timeout_s)
        line = process.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            server.close()
            raise RuntimeError(f"the fork server did not start within {timeout_s:.0f} s "
                               f"(its log: {log_path})")
        return server

    @classmethod
    def attach(cls, socket_path: Path) -> ForkServer:
        return cls(socket_path)

    def spawn(self, argv: Sequence[str], env: dict[str, str], cwd: Path | None,
              output: int) -> ForkedProcess | None:
        """Starts `argv` (see `usable`) with stdout and stderr to the descriptor `output`
        (the caller keeps its own copy open or closes it, as after Popen). None where the
        server runs another interpreter than argv[0] (a caller in another venv that
        inherited FORKSERVER_ENV): the caller starts it itself."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(self.socket_path))
        request = json.dumps({"argv": list(argv), "env": env,
                              "cwd": str(cwd or os.getcwd())}).encode() + b"\n"
        socket.send_fds(conn, [request], [output])
        reply = _read_line(conn, timeout_s=60.0)
        if reply is not None and "refused" in reply:
            conn.close()
            return None
        if reply is None or "pid" not in reply:
            conn.close()
            raise RuntimeError(f"the fork server did not start {list(argv[2:4])}")
        return ForkedProcess(list(argv), int(reply["pid"]), conn)

    def close(self) -> None:
        """Ends a server this object started (its children are not its to end)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        self.socket_path.unlink(missing_ok=True)

    @staticmethod
    def usable(argv: Sequence[str]) -> bool:
        """Whether `argv` is a `python -m MODULE ...` a server may start (the server
        itself refuses another interpreter than its own)."""
        return len(argv) >= 3 and argv[1] == "-m"


_attached: dict[str, ForkServer] = {}


def configured() -> ForkServer | None:
    """The fork server this process was given (FORKSERVER_ENV, a socket path), if any."""
    path = os.environ.get(FORKSERVER_ENV)
    if not path or not Path(path).exists():
        return None
    if path not in _attached:
        _attached[path] = ForkServer.attach(Path(path))
    return _attached[path]


def popen(argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
          output: int | None = None) -> subprocess.Popen | ForkedProcess:
    """Starts `argv` in a session of its own, stdout and stderr together: into the
    descriptor `output`, or (None) captured as text on `.stdout` (`communicate`). From the
    configured fork server where it can start `argv`, else `subprocess.Popen`."""
    env = dict(os.environ if env is None else env)
    server = configured()
    child: ForkedProcess | None = None
    if server is not None and ForkServer.usable(argv):
        if output is not None:
            child = server.spawn(argv, env, cwd, output)
        else:
            read_end, write_end = os.pipe()
            try:
                child = server.spawn(argv, env, cwd, write_end)
            finally:
                os.close(write_end)
            if child is None:
                os.close(read_end)
            else:
                child.stdout = open(read_end, errors="replace")  # noqa: SIM115 - its output
    if child is not None:
        return child
    return subprocess.Popen(
        list(argv), env=env, cwd=cwd, start_new_session=True, stderr=subprocess.STDOUT,
        stdout=subprocess.PIPE if output is None else output, text=output is None)


def _read_line(conn: socket.socket, timeout_s: float | None) -> dict | None:
    """One JSON line from `conn`; None on EOF; TimeoutError past `timeout_s`."""
    data = b""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not data.endswith(b"\n"):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([conn], [], [], left)
        if not ready:
            raise TimeoutError
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


class ForkedProcess:
    """A fork server's child as `subprocess.Popen` shows a process: pid, poll, wait,
    returncode (negative: the signal that ended it), send_signal, terminate, kill, and
    for captured output `stdout` and `communicate` (text)."""

    def __init__(self, args: list[str], pid: int, conn: socket.socket) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self.stdout: io.TextIOWrapper | None = None
        self._conn = conn
        self._output: list[bytes] = []

    def communicate(self, timeout: float | None = None) -> tuple[str | None, None]:
        """Popen.communicate for captured output: all of it once the process has ended;
        TimeoutExpired (output so far kept for the next call) past `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if self.stdout is None:
            self.wait(timeout)
            return None, None
        fd = self.stdout.fileno()
        while True:
            ready, _, _ = select.select([fd], [], [], left())
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout,
                                                output=b"".join(self._output))
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self._output.append(chunk)
        self.stdout.close()
        self.stdout = None
        self.wait(left())
        return b"".join(self._output).decode(errors="replace"), None

    def _settle(self, timeout_s: float | None) -> bool:
        """Reads the exit status if it has come within `timeout_s`; whether it is known."""
        if self.returncode is not None:
            return True
        try:
            reply = _read_line(self._conn, timeout_s)
        except TimeoutError:
            return False
        self._conn.close()
        if reply is None:  # the server died first: the child was re-parented, not ours
            return self._gone_without_status(timeout_s)
        self.returncode = os.waitstatus_to_exitcode(int(reply["status"]))
        return True

    def _gone_without_status(self, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while Path(f"/proc/{self.pid}").exists():
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        self.returncode = -signal.SIGKILL  # unknown: the status went with the server
        return True

    def poll(self) -> int | None:
        if self._conn.fileno() < 0 and self.returncode is None:
            self._gone_without_status(0)
        else:
            self._settle(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._conn.fileno() < 0 and self.returncode is None:
            done = self._gone_without_status(timeout)
        else:
            done = self._settle(timeout)
        if not done:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    main()
