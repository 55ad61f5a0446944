"""Run names that would lead out of the runs root, through every way a run is named (the
config file, `--run`, RLFLEET_RUN, `rlfleet learner submit`, `python -m rlfleet.local.run`),
are refused at config load: one line on stderr, exit code 2, nothing written anywhere,
nothing started. And the learner's human console does not follow a `logs` symlink out of
the run directory.

The commands run as the real CLIs in subprocesses; a refusal that came only after Ray
started would show as Ray's output, an exit code of 1 and a traceback.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlfleet.local.procs import rlfleet_argv
from tests.waits import scaled

BAD_NAMES = ["../../x", "/tmp/x", "sub/../../x", "..", "a/b"]
ROOT = Path(__file__).resolve().parents[2]


def _files(top: Path) -> set[Path]:
    return {p for p in top.rglob("*")} if top.exists() else set()


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT
         ) -> subprocess.CompletedProcess:
    full = {**os.environ, "RLFLEET_CONSOLE": "json"}
    full.pop("RLFLEET_RUN", None)
    full.update(env or {})
    return subprocess.run(argv, env=full, cwd=cwd, capture_output=True, text=True,
                          timeout=scaled(120))


def _assert_refused(proc: subprocess.CompletedProcess, name: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "invalid run name" in lines[0] and repr(name) in lines[0], lines[0]


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, Path]:
    """A runs root two levels down, so `..` and `../..` land inside `tmp_path`, where
    anything written would be seen."""
    root = tmp_path / "a" / "runs"
    root.mkdir(parents=True)
    return tmp_path, root


def _config(tmp_path: Path, root: Path, **fields: object) -> Path:
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump({"fleet": {"runs_root": str(root)}, **fields}))
    return path


@pytest.mark.parametrize("name", BAD_NAMES)
def test_the_learner_refuses_a_bad_run_name_in_its_config_file(
        sandbox: tuple[Path, Path], name: str) -> None:
    tmp_path, root = sandbox
    config = _config(tmp_path, root, run=name)
    before = _files(tmp_path)
    proc = _run(rlfleet_argv("learner", "run", "--config", str(config)))
    _assert_refused(proc, name)
    assert _files(tmp_path) == before


@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "sub/../../x"])
def test_the_learner_refuses_a_bad_run_name_from_its_flag_and_the_environment(
        sandbox: tuple[Path, Path], name: str) -> None:
    tmp_path, root = sandbox
    config = _config(tmp_path, root)
    before = _files(tmp_path)
    _assert_refused(_run(rlfleet_argv("learner", "run", "--config", str(config),
                                      "--run", name)), name)
    _assert_refused(_run(rlfleet_argv("learner", "run", "--config", str(config)),
                         env={"RLFLEET_RUN": name}), name)
    assert _files(tmp_path) == before


def test_learner_submit_refuses_a_bad_run_name_before_it_calls_the_cluster(
        sandbox: tuple[Path, Path]) -> None:
    tmp_path, root = sandbox
    good = _config(tmp_path, root)
    # nothing listens there: a command that got as far as the cluster would say so instead
    address = "http://127.0.0.1:9"
    proc = _run(rlfleet_argv("learner", "submit", "--address", address, "--config",
                             str(good), "--run", "../../x", "--insecure-no-auth"))
    _assert_refused(proc, "../../x")
    bad = _config(tmp_path, root, run="sub/../../x")
    proc = _run(rlfleet_argv("learner", "submit", "--address", address, "--config",
                             str(bad), "--insecure-no-auth"))
    _assert_refused(proc, "sub/../../x")


@pytest.mark.parametrize("name", ["../x", "../../x", "/tmp/x"])
def test_make_run_refuses_a_bad_run_name_before_anything_is_written_or_started(
        sandbox: tuple[Path, Path], name: str) -> None:
    tmp_path, root = sandbox
    before = _files(tmp_path)
    proc = _run([sys.executable, "-m", "rlfleet.local.run", "--run", name, "--runs-root",
                 str(root), "--replicas", "1", "--steps", "1"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "invalid run name" in proc.stderr and "Traceback" not in proc.stderr
    assert "rlfleet local run" not in proc.stdout  # the fleet was never started
    assert _files(tmp_path) == before


def test_make_run_refuses_a_run_directory_that_is_a_symlink_out_of_the_root(
        sandbox: tuple[Path, Path]) -> None:
    tmp_path, root = sandbox
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    proc = _run([sys.executable, "-m", "rlfleet.local.run", "--run", "escape",
                 "--runs-root", str(root), "--replicas", "1", "--steps", "1"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "outside the runs root" in proc.stderr and "Traceback" not in proc.stderr
    assert "rlfleet local run" not in proc.stdout
    assert list(outside.iterdir()) == []


def test_the_human_console_does_not_follow_a_logs_symlink_out_of_the_run(
        tmp_path: Path) -> None:
    from rlfleet_learner.console import learner_log_file, setup_learner_logging

    root = tmp_path / "runs"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "r").mkdir(parents=True)
    (root / "r" / "logs").symlink_to(outside)
    assert learner_log_file(root, "r") is None
    # a learner.log that is itself a link out is refused the same way
    (root / "s" / "logs").mkdir(parents=True)
    (root / "s" / "logs" / "learner.log").symlink_to(outside / "learner.log")
    assert learner_log_file(root, "s") is None
    # the console's set-up then keeps the JSON lines on stderr: nothing lands outside
    saved = logging.getLogger().handlers[:]
    try:
        assert setup_learner_logging("INFO", True, learner_log_file(root, "r")) is None
        logging.getLogger("rlfleet_learner.test").warning("a line")
    finally:
        logging.getLogger().handlers[:] = saved
    assert list(outside.iterdir()) == []
    # a plain run directory still gets its log file, inside the root
    (root / "t").mkdir()
    assert learner_log_file(root, "t") == (root / "t" / "logs" / "learner.log").resolve()
