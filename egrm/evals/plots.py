"""PNG figures of an evaluation: calibration, latency by route, routing against tau, sweeps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from egrm.evals.harness import ItemOutcome
from egrm.pipeline.types import Route


def _pyplot() -> Any:
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its INFO lines would drown the report
    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def plot_eval(outcomes: Sequence[ItemOutcome], report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    fig, (cal, lat, tau) = plt.subplots(1, 3, figsize=(15, 4.2))
    title = f"egrm eval: n={report['n']}, M={report['m']}, tau={report['tau']}, {report['strategy']}"
    fig.suptitle(title)

    estimators = report.get("consensus_estimators") or {"sampled": {"calibration": report["calibration"]}}
    # A reliability diagram: lines, not bars, since the two estimators bin differently (votes of
    # 5 against 0.1 bins of a probability) and bars of one would hide the other's.
    for name, figures in estimators.items():
        rows = [r for r in figures["calibration"] if r["accuracy"] is not None]
        xs = [r["consensus"] + (0.05 if name == "exact" else 0) for r in rows]  # a 0.1 bin: its middle
        ys = [r["accuracy"] for r in rows]
        cal.plot(xs, ys, "--" if name == "exact" else "-", marker="o", label=f"{name} (n at each point)")
        for x, y, r in zip(xs, ys, rows, strict=True):
            cal.annotate(str(r["n"]), (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7)
    cal.plot([0, 1], [0, 1], color="lightgrey", linewidth=1, label="accuracy = consensus")
    cal.axvline(report["tau"], color="grey", linestyle="--", label="tau")
    cal.set(xlabel="consensus (sampled vote; exact: 0.1 bins)", ylabel="accuracy of the short answer", ylim=(0, 1.1))
    cal.set_title("Calibration")
    cal.legend(fontsize=8)

    runs: dict[str, list[float]] = {"routed: short": [], "routed: long": [], "always long": []}
    for o in outcomes:
        if "routed" in o.runs:
            key = "routed: short" if o.runs["routed"].route is Route.SHORT else "routed: long"
            runs[key].append(o.runs["routed"].latency_ms / 1000)
        if "long" in o.runs:
            runs["always long"].append(o.runs["long"].latency_ms / 1000)
    shown = {k: v for k, v in runs.items() if v}
    lat.boxplot(list(shown.values()), tick_labels=[f"{k}\n(n={len(v)})" for k, v in shown.items()])
    lat.set(ylabel="latency per item (s)", yscale="log")
    lat.set_title("Latency by route")

    styles = {"sampled": "-", "exact": "--"}
    for name, figures in estimators.items():
        curve = figures.get("tau_curve", [])
        if not curve:
            continue
        taus = [r["tau"] for r in curve]
        line = styles.get(name, ":")
        tau.plot(taus, [r["accuracy_routed"] for r in curve], line, marker="o", label=f"routed accuracy ({name})")
        tau.plot(taus, [r["short_path_rate"] for r in curve], line, marker="s", label=f"short-path rate ({name})")
        tau.plot(
            taus,
            [r["latency_ratio_routed_vs_long"] for r in curve],
            line,
            marker="^",
            label=f"latency vs always-long ({name})",
        )
    if report.get("accuracy_always_long") is not None:
        tau.axhline(report["accuracy_always_long"], color="grey", linestyle=":", label="always-long accuracy")
    tau.set(xlabel="tau", ylim=(0, 1.05))
    tau.legend(fontsize=7)
    tau.set_title("Routing against tau")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    if report.get("frontier"):
        plot_frontier(report["frontier"], path.with_name(path.stem + "_frontier" + path.suffix), report.get("load"))
    return path


def plot_frontier(points: Sequence[dict[str, Any]], path: Path, load: dict[str, Any] | None = None) -> Path:
    """Accuracy against cost, one marker per way to route (frontier.py): against latency at one
    client, against completion tokens per item, and (with a load run that held always long, the
    baseline) items/s under load."""
    plt = _pyplot()
    load = load if load and "items_per_s_vs_always_long" in load else None
    panels = 3 if load else 2
    fig, axes = plt.subplots(1, panels, figsize=(7.5 * panels, 5))
    _frontier(axes[0], points, "latency_ratio_routed_vs_long", labels=True)
    axes[0].set(xlabel="mean latency, against reasoning on every item", ylabel="accuracy")
    axes[0].set_title("Routing: accuracy against latency")
    _frontier(axes[1], points, "completion_tokens", labels=False)
    axes[1].set(xlabel="completion tokens per item", ylabel="accuracy")
    axes[1].set_title("Routing: accuracy against tokens decoded")
    if load:
        ratios = load["items_per_s_vs_always_long"]
        for name, run in load["policies"].items():
            at = (ratios[name], run["accuracy"])
            axes[2].scatter([at[0]], [at[1]], s=60)
            axes[2].annotate(name, at, textcoords="offset points", xytext=(4, 4), fontsize=8)
        axes[2].set(xlabel="items/s against always long", ylabel="accuracy")
        axes[2].set_title(f"Under load: {load['clients']} clients, groups of {load['group']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _frontier(ax: Any, points: Sequence[dict[str, Any]], x: str, labels: bool) -> None:
    markers = {"always": "s", "vote": "o", "exact": "^", "adaptive": "D", "calibrated": "*"}
    for kind, marker in markers.items():
        mine = [p for p in points if p["kind"] == kind]
        if mine:
            xs = [p[x] for p in mine]
            ys = [p["accuracy_routed"] for p in mine]
            ax.scatter(xs, ys, marker=marker, s=120 if kind == "calibrated" else 50, label=kind)
            if not labels or kind == "adaptive":  # six points close together: the legend names them
                continue
            # The calibrated policy often sits on another point: its label goes below, the others' above.
            offset = (4, -10) if kind == "calibrated" else (4, 4)
            for p, px, py in zip(mine, xs, ys, strict=True):
                name = "calibrated" if kind == "calibrated" else p["name"]
                label = f"{name} ({p['short_path_rate']:.0%} short)"
                ax.annotate(label, (px, py), textcoords="offset points", xytext=offset, fontsize=7)
    ax.legend(fontsize=8)


def plot_sweep(name: str, rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """One line per metric against the swept value (m, tau or strategy)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    # m and tau on a numeric axis; strategies as categories
    xs = [r[name] if isinstance(r[name], (int, float)) else str(r[name]) for r in rows]
    metrics = ("accuracy_routed", "accuracy_always_short", "short_path_rate", "short_path_accuracy", "mean_consensus")
    for metric in metrics:
        ys = [r.get(metric) for r in rows]
        if any(y is not None for y in ys):
            ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="o", label=metric)
    ax.set(xlabel=name, ylim=(0, 1.05))
    ax.set_title(f"Sweep over {name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
