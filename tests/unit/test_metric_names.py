"""Every rlfleet metric follows Prometheus naming: the `rlfleet_` prefix, base units in
the name (`_seconds`, `_bytes`), fractions as `_ratio`, counters declared `_total`, and
RPC metrics labelled `grpc_service` / `grpc_method` / `grpc_code`. Checked on the live
registry after importing every module that defines metrics, so a new metric that breaks a
rule fails here; and the dashboards and autoscaler only name metrics that exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

REPO = Path(__file__).resolve().parents[2]
SOURCES = [REPO / "libs", *sorted(p for p in (REPO / "services").glob("*") if p.is_dir())]
# prometheus_client's own collectors
DEFAULT_PREFIXES = ("process_", "python_", "platform_")

NAME = re.compile(r"^rlfleet_[a-z][a-z0-9]*(_[a-z0-9]+)*$")
# units and fractions spelled otherwise than Prometheus' base units
NOT_BASE_UNITS = {"ms", "msec", "millis", "milliseconds", "sec", "secs", "minutes", "mins",
                  "hours", "kb", "mb", "gb", "kib", "mib", "gib", "percent", "pct", "rate",
                  "fraction"}
# series suffixes Prometheus derives itself
RESERVED_SUFFIXES = ("_count", "_sum", "_bucket", "_created", "_total")
BARE_RPC_LABELS = {"method", "code", "service", "status"}
MENTIONS_TIME = re.compile(r"\b(seconds?|time|latency|duration)\b")
COUNTER_DECLARATION = re.compile(r"\b(Counter|CounterMetricFamily)\(\s*\"([^\"]+)\"")


def metric_modules() -> list[str]:
    """Every module of the library and the services that uses prometheus_client."""
    names = []
    for base in SOURCES:
        for path in sorted(base.rglob("*.py")):
            if "prometheus_client" in path.read_text(errors="replace"):
                names.append(".".join(path.relative_to(base).with_suffix("").parts))
    return names


@pytest.fixture(scope="module")
def families() -> dict[str, dict]:
    """name -> {type, help, labels, declared} for every rlfleet metric registered."""
    for module in metric_modules():
        importlib.import_module(module)
    found: dict[str, dict] = {}
    # The registry's collectors (a private map; the public collect() omits the label names
    # of a labelled metric that has no child yet).
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001
        declared = getattr(collector, "_original_name", None)
        labels = set(getattr(collector, "_labelnames", ()))
        for family in collector.collect():
            if family.name.startswith(DEFAULT_PREFIXES):
                continue
            entry = found.setdefault(family.name, {"type": family.type,
                                                   "help": family.documentation,
                                                   "labels": set(), "declared": declared})
            entry["labels"] |= labels | {k for s in family.samples for k in s.labels
                                         if k not in ("le", "quantile")}
    return found


def test_the_modules_define_the_fleets_metrics(families: dict[str, dict]) -> None:
    # the walk found every service's metrics (a broken walk would pass every rule below)
    for prefix in ("rlfleet_grpc_", "rlfleet_env_", "rlfleet_rollout_", "rlfleet_learner_",
                   "rlfleet_sync_", "rlfleet_pool_", "rlfleet_fleet_"):
        assert any(name.startswith(prefix) for name in families), prefix


def test_names_prefix_units_and_ratios(families: dict[str, dict]) -> None:
    bad = []
    for name, f in families.items():
        words = set(name.split("_"))
        if not NAME.match(name):
            bad.append(f"{name}: not rlfleet_ snake_case")
        if words & NOT_BASE_UNITS:
            bad.append(f"{name}: {sorted(words & NOT_BASE_UNITS)} (base units: _seconds, "
                       "_bytes; fractions: _ratio)")
        if not f["help"].strip():
            bad.append(f"{name}: no help text")
        if f["type"] == "counter":
            continue
        if name.endswith(RESERVED_SUFFIXES):
            bad.append(f"{name}: a {f['type']} must not end in a reserved suffix")
        text = f["help"].lower()
        if MENTIONS_TIME.search(text) and not name.endswith("_seconds"):
            bad.append(f"{name}: measures time ({f['help']!r}), so ends in _seconds")
        if "bytes" in text and not name.endswith("_bytes"):
            bad.append(f"{name}: measures bytes ({f['help']!r}), so ends in _bytes")
        if "fraction" in text and not name.endswith("_ratio"):
            bad.append(f"{name}: a fraction ({f['help']!r}), so ends in _ratio")
    assert not bad, "\n".join(bad)


def test_counters_are_declared_with_total(families: dict[str, dict]) -> None:
    counters = {name: f for name, f in families.items() if f["type"] == "counter"}
    assert counters
    for f in counters.values():
        if f["declared"] is not None:  # a Counter (a custom collector: the source below)
            assert f["declared"].endswith("_total"), f"{f['declared']}: declare it _total"
    declared = [m.group(2) for base in SOURCES for path in base.rglob("*.py")
                for m in COUNTER_DECLARATION.finditer(path.read_text(errors="replace"))]
    assert declared
    assert [n for n in declared if not n.endswith("_total")] == []


def test_rpc_metrics_are_labelled_grpc_service_method_and_code(families: dict[str, dict]
                                                               ) -> None:
    for name, f in families.items():
        assert not f["labels"] & BARE_RPC_LABELS, \
            f"{name}: labels {sorted(f['labels'] & BARE_RPC_LABELS)} must be grpc_<label>"
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", label) for label in f["labels"]), name
        if name.startswith("rlfleet_grpc_"):
            assert {"grpc_service", "grpc_method"} <= f["labels"], name
    assert "grpc_code" in families["rlfleet_grpc_requests"]["labels"]


def test_dashboards_and_autoscaling_name_only_metrics_that_exist(families: dict[str, dict]
                                                                 ) -> None:
    series = set()
    for name, f in families.items():
        series |= {name, f"{name}_total", f"{name}_created"} if f["type"] == "counter" else \
            {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    deploy = REPO / "deploy"
    texts = [p.read_text() for p in [*deploy.rglob("*.json"), *deploy.rglob("*.yaml")]
             if "schema" not in p.name]
    named = {m for text in texts for m in re.findall(r"\brlfleet_[a-z0-9_]+", text)}
    metrics = {m for m in named if not m.startswith(("rlfleet_tiny", "rlfleet_learner."))}
    assert metrics  # the dashboard's panels
    # names in deploy/ that are not metrics (images, packages) are not series of ours:
    # only those that look like one of our metric families must exist
    families_named = {m for m in metrics
                      if any(m.startswith(p) for p in ("rlfleet_grpc_", "rlfleet_env_",
                                                       "rlfleet_rollout_", "rlfleet_learner_",
                                                       "rlfleet_sync_", "rlfleet_pool_"))}
    assert sorted(families_named - series) == []
