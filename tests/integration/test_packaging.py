"""`pip install .[env]` in a clean virtual environment gives a working `rlfleet env serve`:
pyproject.toml's declared dependencies are enough (no torch, nothing from the checkout),
and the lock's versions install."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from rlfleet.local.procs import free_port
from tests.waits import scaled

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_pip_install_env_extra_in_a_clean_venv_serves(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # A copy of what a source distribution holds (setuptools builds in the source tree:
    # this checkout stays clean), with the generated gRPC stubs that `make proto` wrote.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("libs", "services", "pyproject.toml", "README.md"):
        subprocess.run(["cp", "-r", str(ROOT / name), str(src)], check=True)
    out = subprocess.run([str(py), "-m", "pip", "install", "-q", "-c",
                          str(ROOT / "requirements.txt"), f"{src}[env]"],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path,
                         env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format", "freeze"],
                            capture_output=True, text=True, check=True).stdout.lower()
    assert "torch==" not in listed and "transformers==" not in listed  # the env extra is slim
    port, metrics = free_port(), free_port()
    rlfleet = env_dir / "bin" / "rlfleet"
    server = subprocess.Popen([str(rlfleet), "env", "serve", "--port", str(port),
                               "--metrics-port", str(metrics), "--insecure-no-auth"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + scaled(120)
        status = None
        while time.monotonic() < deadline and server.poll() is None:
            check = subprocess.run([str(rlfleet), "health", f"127.0.0.1:{port}"], cwd=tmp_path,
                                   capture_output=True, text=True, timeout=30)
            status = check.stdout.strip()
            if status == "SERVING":
                break
            time.sleep(1)
        assert status == "SERVING", (status, server.poll())
    finally:
        server.terminate()
        log, _ = server.communicate(timeout=60)
    assert server.returncode == 0, log[-2000:]
    assert sys.prefix != str(env_dir)
