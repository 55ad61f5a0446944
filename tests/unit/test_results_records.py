"""Measured runs are committed records; docs/results.md and the README's results table are
generated from them and kept current by this test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlfleet.learner_config import load_learner_config
from rlfleet.local import records

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def in_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)
    return ROOT


def test_the_results_page_and_readme_table_are_current(in_root: Path) -> None:
    assert records.main(["--check"]) == 0, (
        "docs/results.md or the README's results table is stale: "
        "python -m rlfleet.local.records")


def test_every_committed_record_reads(in_root: Path) -> None:
    recs = records.read_records()
    assert recs, "results/ holds no record"
    for r in recs:
        if r.get("curve_png"):
            assert (ROOT / "results" / r["curve_png"]).is_file(), r["name"]


def figures(after: float) -> dict:
    return {"steps": 10, "wall_clock_s": 300.0,
            "heldout": {"before": 0.4, "after": after, "after_se": 0.03, "episodes": 256}}


def test_a_record_is_written_once_and_read_back(tmp_path: Path, in_root: Path) -> None:
    cfg = load_learner_config(ROOT / "configs" / "local-tiny.yaml", env={})
    png = tmp_path / "c.png"
    png.write_bytes(b"\x89PNG")
    path = records.write_record("r-1", "make run", "make run", figures(0.7),
                                recipe=records.recipe_of(cfg), config="configs/local-tiny.yaml",
                                curve_png=png, records_dir=tmp_path / "results")
    record = json.loads(path.read_text())
    assert record["recipe_hash"] == records.shipped_recipe_hash(Path("configs/local-tiny.yaml"))
    assert record["curve_png"] == "r-1.png" and (tmp_path / "results" / "r-1.png").is_file()
    assert record["machine"]["cores"] == os.cpu_count()
    with pytest.raises(records.RecordError, match="never overwritten"):
        records.write_record("r-1", "make run", "make run", figures(0.7),
                             records_dir=tmp_path / "results")
    with pytest.raises(records.RecordError, match="record name"):
        records.write_record("../x", "make run", "make run", figures(0.7),
                             records_dir=tmp_path / "results")
    assert [r["name"] for r in records.read_records(tmp_path / "results")] == ["r-1"]


def test_the_readme_shows_only_runs_of_todays_recipes(tmp_path: Path, in_root: Path) -> None:
    cfg = load_learner_config(ROOT / "configs" / "local-tiny.yaml", env={})
    current = records.recipe_of(cfg)
    older = json.loads(json.dumps(current))
    older["steps"] = 3
    out = tmp_path / "results"
    records.write_record("now", "make run", "make run", figures(0.75), recipe=current,
                         records_dir=out)
    records.write_record("then", "make run", "make run", figures(0.5), recipe=older,
                         records_dir=out)
    recs = records.read_records(out)
    table = records.readme_table(recs)
    assert "75.0%" in table and "50.0%" not in table
    assert "not measured yet" in table  # the 9x9 profile has no record here
    page = records.results_page(recs)
    assert "75.0%" in page and "50.0%" in page and "an earlier recipe" in page


def test_a_broken_record_is_named(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(records.RecordError, match="bad.json"):
        records.read_records(tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"name": "bad"}))
    with pytest.raises(records.RecordError, match="has no 'kind'"):
        records.read_records(tmp_path)
