"""The suite's own rules hold: tests that must share an xdist worker do (the grouping is
pytest-xdist's `--dist loadgroup`, which a pytest/xdist pair can silently break), a
process left running is found, named and charged to the test that started it, and every
deadline scales with one factor."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlfleet.local import marks
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
    """Static xdist_group marks and this suite's rule (the heavy tiers, marked heavy or
    vllm, share one group, whatever groups of their own they have) both keep their tests
    on one of two workers."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    vllm: the vllm tier\n    heavy: a heavy tier\n"
        "timeout = 60\n")
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
                       ("heavy_a", "pytest.mark.vllm"), ("heavy_b", "pytest.mark.heavy"),
                       ("heavy_c", '[pytest.mark.vllm, pytest.mark.xdist_group("own")]')]:
        (tmp_path / f"test_{name}.py").write_text(
            body.format(mark=mark, out=tmp_path / "where.txt", name=name))
    proc = run_pytest(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where: dict[str, set[str]] = {}
    for line in (tmp_path / "where.txt").read_text().splitlines():
        name, worker = line.split()
        where.setdefault(name.split("_")[0], set()).add(worker)
    assert len(where["static"]) == 1, where  # 8 tests of group g: one worker
    # 8 vllm-marked tests (4 with a group of their own), 4 heavy-marked: one worker
    assert len(where["heavy"]) == 1, where


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


LEAKY_TESTS = {
    "test_a.py": """
        import os, subprocess, sys
        from rlfleet.local.forkserver import popen
        def test_leaks_a_child():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{token}"],
                             start_new_session=True)
        def test_leaks_a_forked_child(tmp_path):
            (tmp_path / "sleeper.py").write_text("import time\\ntime.sleep(600)\\n")
            popen([sys.executable, "-m", "sleeper", "{token}"], cwd=tmp_path,
                  output=os.open(os.devnull, os.O_WRONLY))
        def test_stops_what_it_starts():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """,
    "test_b.py": """
        import subprocess, sys
        import pytest
        @pytest.fixture(scope="module")
        def shared():
            yield subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                    "{token}"])
        def test_uses_it(shared):
            pass
        def test_uses_it_too(shared):
            pass
        """,
    "test_c.py": """
        def test_after_them():
            pass
        """,
}


@pytest.mark.slow  # a pytest session of its own, with a fork server
def test_a_leak_is_charged_to_the_test_that_made_it(tmp_path: Path) -> None:
    """A process left running fails the test that started it (in its tear-down), named by
    its node id, whether exec'd or forked by the fork server; one a module's fixture
    started fails when the module's fixtures are torn down, naming the fixture and the
    test it was set up for; the next tests are not charged, and nothing is left."""
    import xml.etree.ElementTree as ET

    token = f"leak-{os.getpid()}-{tmp_path.name}"
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntimeout = 300\n")
    for name, body in LEAKY_TESTS.items():
        (tmp_path / name).write_text(textwrap.dedent(body).replace("{token}", token))
    # short leak checks (their grace is scaled), the fork server given long enough
    proc = run_pytest(tmp_path, "-p", "no:randomly", f"--junitxml={tmp_path / 'out.xml'}",
                      f"--basetemp={tmp_path / 'b'}", env={ENV: "0.2"})
    errors = {}
    for case in ET.parse(tmp_path / "out.xml").iter("testcase"):
        for error in case.iter("error"):
            errors[case.get("name")] = error.get("message", "") + (error.text or "")
    assert sorted(errors) == ["test_leaks_a_child", "test_leaks_a_forked_child",
                              "test_uses_it_too"], proc.stdout[-4000:]
    assert "1 process(es) still running after its test" in errors["test_leaks_a_child"]
    assert "started by test_a.py::test_leaks_a_child:" in errors["test_leaks_a_child"]
    assert f"time.sleep(600) {token}" in errors["test_leaks_a_child"]
    forked = errors["test_leaks_a_forked_child"]
    assert "started by test_a.py::test_leaks_a_forked_child:" in forked
    assert "rlfleet.local.forkserver" in forked  # a forked child shows the server's argv
    shared = errors["test_uses_it_too"]
    assert "after its module's fixtures were torn down" in shared
    assert "started by test_b.py::test_uses_it (its fixture shared, module-scoped):" in shared
    assert proc.returncode == 1, proc.stdout[-4000:]  # errors, nothing else failed
    assert "6 passed, 3 errors" in proc.stdout, proc.stdout[-2000:]
    # killed by the checks: none of the three runs on (the forked one under the nested
    # session's fork server, whose socket lies in its base temp folder)
    left = marks.live_processes()
    assert not [p for p in left if token in p.cmd or str(tmp_path) in p.cmd]
