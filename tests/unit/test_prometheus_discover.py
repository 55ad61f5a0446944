"""The chart's Prometheus discovery (deploy/helm/rlfleet/files/prometheus-discover.py): which
pods become targets, at which address and path, with which labels."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "deploy/helm/rlfleet/files/prometheus-discover.py"


def load():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("prometheus_discover", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pod(name: str, *, ip: str | None = "10.88.0.7", phase: str = "Running",
        notes: dict | None = None, labels: dict | None = None, deleting: bool = False) -> dict:
    meta = {"name": name, "labels": labels or {},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9102",
                            **(notes or {})}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "podIP": ip}}


def test_running_annotated_pods_become_labelled_targets() -> None:
    found = load().targets([
        pod("rollout-b", labels={"app.kubernetes.io/component": "rollout"}),
        pod("head", ip="10.88.0.9", notes={"prometheus.io/port": "9104"},
            labels={"app.kubernetes.io/component": "learner", "rlfleet.io/ray-node": "head"}),
        pod("reward", notes={"prometheus.io/path": "/m"},
            labels={"app.kubernetes.io/component": "reward", "rlfleet.io/reward": "task"}),
    ], "ns")
    assert found == [
        {"targets": ["10.88.0.9:9104"],
         "labels": {"namespace": "ns", "pod": "head", "__metrics_path__": "/metrics",
                    "component": "learner", "ray_node": "head"}},
        {"targets": ["10.88.0.7:9102"],
         "labels": {"namespace": "ns", "pod": "reward", "__metrics_path__": "/m",
                    "component": "reward", "reward": "task"}},
        {"targets": ["10.88.0.7:9102"],
         "labels": {"namespace": "ns", "pod": "rollout-b", "__metrics_path__": "/metrics",
                    "component": "rollout"}},
    ]


def test_pods_not_to_scrape_are_left_out() -> None:
    assert load().targets([
        pod("off", notes={"prometheus.io/scrape": "false"}),
        pod("no-port", notes={"prometheus.io/port": ""}),
        pod("pending", ip=None, phase="Pending"),
        pod("done", phase="Succeeded"),
        pod("leaving", deleting=True),
    ], "ns") == []
