"""`make cluster-down` and the node's /shared (scripts/k8s/shared-dir.sh): kept and said
so by default (a later deploy resumes its runs), removed with PURGE=1, and never a path
that is / or relative, however written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "k8s" / "shared-dir.sh"


def shared_dir(action: str, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), action, path], capture_output=True,
                          text=True, timeout=30)


def test_report_keeps_the_directory_and_names_its_runs(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "runs" / "tiny-maze").mkdir(parents=True)
    out = shared_dir("report", str(shared))
    assert out.returncode == 0, out.stderr
    assert shared.is_dir()
    assert f"kept {shared}" in out.stderr and "tiny-maze" in out.stderr
    assert "make cluster-down PURGE=1" in out.stderr


def test_purge_removes_it(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "runs" / "r" / "checkpoints").mkdir(parents=True)
    out = shared_dir("purge", f"{shared}/")
    assert out.returncode == 0, out.stderr
    assert not shared.exists() and f"removed {shared}" in out.stderr


def test_no_directory_nothing_said(tmp_path: Path) -> None:
    out = shared_dir("report", str(tmp_path / "absent"))
    assert out.returncode == 0 and out.stderr == ""


@pytest.mark.parametrize("path", ["/", "//", "/./", "/tmp/..", "relative/dir"])
def test_root_or_relative_paths_are_refused(path: str) -> None:
    out = shared_dir("purge", path)
    assert out.returncode == 2 and "refusing" in out.stderr
