"""rlfleet.storage.paths: layout and containment of every path named by a caller."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlfleet.storage.paths import (
    InvalidRunName,
    PathOutsideRunsRoot,
    RunsRoot,
    default_runs_root,
    parse_step_dirname,
    parse_version_dirname,
)


@pytest.fixture
def rr(tmp_path: Path) -> RunsRoot:
    root = tmp_path / "runs"
    root.mkdir()
    return RunsRoot(root)


def test_layout(rr: RunsRoot) -> None:
    assert rr.run_dir("exp-1") == rr.root / "exp-1"
    assert rr.adapter_dir("exp-1", 42) == rr.root / "exp-1" / "adapters" / "v000042"
    assert rr.checkpoint_dir("exp-1", 40) == rr.root / "exp-1" / "checkpoints" / "step_000040"
    assert rr.eval_dir("exp-1") == rr.root / "exp-1" / "eval"
    assert rr.eval_dir("exp-1", 40) == rr.root / "exp-1" / "eval" / "step_000040"
    assert rr.metrics_path("exp-1") == rr.root / "exp-1" / "metrics.jsonl"
    assert parse_version_dirname("v000042") == 42
    assert parse_version_dirname(".v000042.tmp-1-abc") is None
    assert parse_step_dirname("step_000040") == 40
    assert parse_step_dirname("step_40") is None


def test_default_root_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RLFLEET_RUNS_ROOT", raising=False)
    assert default_runs_root() == Path("/shared/runs")
    monkeypatch.setenv("RLFLEET_RUNS_ROOT", str(tmp_path))
    assert RunsRoot().root == Path(os.path.realpath(tmp_path))


@pytest.mark.parametrize("bad", [
    "../x", "a/../../x", "a/../b", "..", "/etc/passwd", "//etc", "a\x00b", "",
    "a/" * 600, "x" * 300,
])
def test_resolve_refuses_escapes(rr: RunsRoot, bad: str) -> None:
    with pytest.raises(PathOutsideRunsRoot):
        rr.resolve(bad)


def test_resolve_accepts_inside(rr: RunsRoot) -> None:
    assert rr.resolve("exp/adapters/v000001") == rr.root / "exp" / "adapters" / "v000001"
    assert rr.resolve("./exp") == rr.root / "exp"


def test_symlink_escape_refused(rr: RunsRoot, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (rr.root / "evil").symlink_to(outside)
    with pytest.raises(PathOutsideRunsRoot, match="outside the runs root"):
        rr.resolve("evil/secret")
    with pytest.raises(PathOutsideRunsRoot):
        rr.run_dir("evil")
    with pytest.raises(PathOutsideRunsRoot):
        rr.adapter_dir("evil", 1)
    # A symlink that stays inside the root is fine.
    (rr.root / "real").mkdir()
    (rr.root / "alias").symlink_to(rr.root / "real")
    assert rr.resolve("alias/x") == rr.root / "real" / "x"


def test_root_itself_may_be_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "mnt"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    rr = RunsRoot(tmp_path / "link")
    assert rr.run_dir("r") == real / "r"


@pytest.mark.parametrize("bad", [".", "..", "", "a/b", "a b", "x" * 65, "run\x00", "é", 7])
def test_run_names_validated(rr: RunsRoot, bad: object) -> None:
    with pytest.raises(InvalidRunName):
        rr.run_dir(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_indices_validated(rr: RunsRoot, bad: object) -> None:
    with pytest.raises(ValueError):
        rr.adapter_dir("r", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        rr.checkpoint_dir("r", bad)  # type: ignore[arg-type]


def test_list_runs(rr: RunsRoot) -> None:
    (rr.root / "b").mkdir()
    (rr.root / "a").mkdir()
    (rr.root / "file").write_text("x")
    (rr.root / "bad name").mkdir()
    assert rr.list_runs() == ["a", "b"]
