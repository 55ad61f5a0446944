"""The suite's own rules hold: tests that must share an xdist worker do (the grouping is
pytest-xdist's `--dist loadgroup`, which a pytest/xdist pair can silently break), a
process left running is found and named, and every deadline scales with one factor."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import leaks
from tests.waits import ENV, wait_until

REPO = Path(__file__).resolve().parents[2]


def run_pytest(directory: Path, *args: str, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=directory, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_grouped_tests_share_one_worker(tmp_path: Path) -> None:
    """Static xdist_group marks and this suite's rule (the vllm mark joins the vllm
    group) both keep their tests on one of two workers."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    vllm: the vllm tier\ntimeout = 60\n")
    body = textwrap.dedent("""
        import os, time
        import pytest
        pytestmark = {mark}
        @pytest.mark.parametrize("i", range(4))
        def test_where(i):
            time.sleep(0.2)
            with open("{out}", "a") as f:
                f.write("{name} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")
        """)
    for name, mark in [("static_a", 'pytest.mark.xdist_group("g")'),
                       ("static_b", 'pytest.mark.xdist_group("g")'),
                       ("vllm_a", "pytest.mark.vllm"), ("vllm_b", "pytest.mark.vllm")]:
        (tmp_path / f"test_{name}.py").write_text(
            body.format(mark=mark, out=tmp_path / "where.txt", name=name))
    proc = run_pytest(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where: dict[str, set[str]] = {}
    for line in (tmp_path / "where.txt").read_text().splitlines():
        name, worker = line.split()
        where.setdefault(name.split("_")[0], set()).add(worker)
    assert len(where["static"]) == 1, where  # 8 tests of group g: one worker
    assert len(where["vllm"]) == 1, where    # 8 vllm-marked tests: one worker


def test_a_process_left_running_is_named_and_killed() -> None:
    # A mark of its own: the check kills what carries the mark, and this session's
    # processes (a session-scoped API server) must live on.
    mark = "test-of-the-leak-check"
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True,  # as an orphaned service would be
                             env={**os.environ, leaks.MARK_ENV: mark})
    try:
        # until the child has exec'd, /proc shows the environment it was forked with
        wait_until("the stray to carry its mark", lambda: stray.pid in leaks.marked_processes(mark))
        assert stray.pid not in leaks.marked_processes(os.environ[leaks.MARK_ENV])
        with pytest.raises(AssertionError, match=rf"(?s)1 process.*{stray.pid}: .*time.sleep"):
            leaks.assert_none_left(grace_s=0.5, mark=mark)
        assert stray.wait(timeout=30) == -9  # killed by the check
        assert stray.pid not in leaks.marked_processes(mark)
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


@pytest.mark.parametrize("value,expected", [("1", 1.0), ("2.5", 2.5)])
def test_deadlines_scale_with_one_factor(value: str, expected: float) -> None:
    code = "from tests.waits import SCALE, scaled; print(SCALE, scaled(10))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, ENV: value}, check=True).stdout.split()
    assert [float(x) for x in out] == [expected, 10 * expected]


@pytest.mark.parametrize("value", ["0", "-1", "fast"])
def test_a_bad_factor_is_refused_by_name(value: str) -> None:
    proc = subprocess.run([sys.executable, "-c", "import tests.waits"], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, ENV: value})
    assert proc.returncode != 0
    assert f"{ENV}={value!r}: a positive number" in proc.stderr


def test_the_per_test_time_out_is_scaled(tmp_path: Path) -> None:
    """pyproject's time-out (here 1 s) times the factor: a 2 s test passes at factor 4
    and is ended, by name, at factor 1."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 1\n")
    (tmp_path / "test_slow.py").write_text("import time\ndef test_two_seconds():\n"
                                           "    time.sleep(2)\n")
    assert run_pytest(tmp_path, env={ENV: "4"}).returncode == 0
    failed = run_pytest(tmp_path, env={ENV: "1"})
    assert failed.returncode != 0
    assert "Timeout" in failed.stdout and "test_two_seconds" in failed.stdout
