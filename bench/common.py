"""Shared by the benchmarks: result files (JSON + a PNG bar chart) and a printed table.

Figures on these shared machines are noisy: compare ratios measured in one run, never
absolute numbers across runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def timed(fn, *, min_time_s: float = 1.0, max_iters: int = 1_000_000) -> tuple[float, int]:  # noqa: ANN001
    """Calls fn() repeatedly for at least min_time_s; returns (seconds per call, calls)."""
    fn()  # warm-up
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time_s or n >= max_iters:
            return elapsed / n, n


def write_results(name: str, rows: list[dict[str, Any]], *, value_key: str, unit: str,
                  meta: dict[str, Any] | None = None, title: str = "",
                  plot: bool = True) -> Path:
    """The JSON result, its table, and (``plot``) its PNG. A bench that runs under the
    vLLM venv, which has no matplotlib, writes ``plot=False`` and its parent draws."""
    from rlfleet.local.records import machine  # the one description of a machine

    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "bench": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "meta": meta or {},
        "rows": rows,
    }
    path = RESULTS / f"{name}.json"
    doc["meta"]["plot"] = {"value_key": value_key, "unit": unit, "title": title or name}
    path.write_text(json.dumps(doc, indent=2))
    print_table(title or name, rows)
    if plot:
        plot_results(path)
    else:
        print(f"wrote {path}")
    return path


def plot_results(path: Path) -> Path:
    """The PNG beside a result JSON that `write_results` wrote."""
    doc = json.loads(path.read_text())
    spec = doc["meta"]["plot"]
    png = path.with_suffix(".png")
    plot_bars(png, doc["rows"], spec["value_key"], spec["unit"], spec["title"])
    print(f"wrote {path} and {png}")
    return png


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_fmt(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print(f"\n{title}")
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def plot_bars(path: Path, rows: list[dict[str, Any]], value_key: str, unit: str,
              title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(r.get("case", i)) for i, r in enumerate(rows)]
    values = [float(r[value_key]) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(rows)))
    ax.barh(labels, values, color="#4878cf")
    ax.invert_yaxis()
    ax.set_xscale("log" if max(values) / max(min(values), 1e-12) > 50 else "linear")
    ax.set_xlabel(unit)
    ax.set_title(title)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,.3g}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
