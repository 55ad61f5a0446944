"""`make bench`'s closing summary reads back whatever results there are: all of them, a
subset, or counts that came out as floats (a mean over runs), and never fails on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.summary import limit_rows, print_summary

LEARNER = {
    "meta": {"targets": {"signal_per_min": 399, "update_vs_bare": 0.7, "rollout_vs_bare": 0.7}},
    "rows": [{"case": "sync", "signal_per_min": 512.4, "update_vs_bare": 0.81,
              "rollout_vs_bare": 0.66, "pool_refused": 0.0, "pool_retries": 2.0,
              "pool_met": False}],
}
ENV = {"meta": {"target_case": "gRPC batch=64 image=yes", "target_steps_per_s": 2000.0},
       "rows": [{"case": "gRPC batch=64 image=yes", "steps_per_s": 2450.7}]}
SYNC = {"meta": {"target_x_floor": 1.5},
        "rows": [{"case": "8B-sized adapter -> 4 replica(s)", "x_floor": 1.21}]}


def results(tmp_path: Path, **benches: dict) -> Path:
    for name, data in benches.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    return tmp_path


def test_every_bench_summarised_with_its_limit(tmp_path: Path) -> None:
    rows = limit_rows(results(tmp_path, bench_learner=LEARNER, bench_env=ENV,
                              bench_sync=SYNC))
    by_what = {what: (measured, limit, met) for what, measured, limit, met in rows}
    assert by_what["signal trajectories/min (sync)"] == ("512", ">= 399", "yes")
    assert by_what["rollout vs bare fwd (sync)"] == ("0.66", ">= 0.7x", "NO")
    assert by_what["pool refused + retried (sync)"] == ("2", "0", "NO")
    assert by_what["env steps/s (gRPC batch=64 image=yes)"][2] == "yes"
    assert by_what["adapter sync x floor (8B-sized adapter -> 4 replica(s))"][2] == "yes"


@pytest.mark.parametrize("subset", [{}, {"bench_env": ENV}, {"bench_learner": LEARNER}])
def test_a_subset_of_benches_prints_without_error(tmp_path: Path, subset: dict,
                                                  capsys: pytest.CaptureFixture) -> None:
    print_summary(results(tmp_path, **subset))
    out = capsys.readouterr().out
    assert ("measured" in out) == bool(subset)
    assert "issue" not in out.lower()
