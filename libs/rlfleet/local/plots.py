"""Plots of a run: the learning curve (sampled reward per step, greedy eval solve rate)."""

from __future__ import annotations

from pathlib import Path


def learning_curve(steps: list[dict], evals: list[dict], out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    if steps:
        xs = [s["step"] for s in steps]
        ax1.plot(xs, [s["reward_mean"] for s in steps], label="mean reward (sampled)",
                 color="#4878cf")
        ax1.plot(xs, [s["solve_rate_sampled"] for s in steps], label="solved (sampled)",
                 color="#6acc65", alpha=0.8)
    ax1.set_ylabel("training rollouts")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend(loc="lower right")
    ax1.grid(alpha=0.3)
    for name, color in (("eval", "#d65f5f"), ("heldout", "#956cb4")):
        pts = [(e["step"], e[name]) for e in evals if name in e]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ys = [100 * p[1]["solve_rate"] for p in pts]
        err = [100 * p[1]["solve_rate_se"] for p in pts]
        kind = "eval" if name == "eval" else "held-out"
        label = f"{pts[0][1]['episodes']} {kind} mazes"
        ax2.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label, color=color)
    ax2.set_ylabel("greedy true solve rate (%)")
    ax2.set_xlabel("GRPO step")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
