"""`egrm eval`: load a labelled set, run it through the real pipeline, report, plot, sweep."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from egrm.config import MAX_M, Settings
from egrm.evals.data import LabelledItem, load_dataset
from egrm.evals.harness import MODES, STRATEGIES, EvalConfig, ItemOutcome, ModeRun, evaluate
from egrm.evals.load import throughput
from egrm.evals.pairwise import evaluate_pairs
from egrm.evals.report import summarise
from egrm.factory import pipeline_from
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.types import Route

SWEEPABLE = ("m", "tau", "strategy")


@dataclass(frozen=True, slots=True)
class Sweep:
    name: str
    values: tuple[Any, ...]

    @classmethod
    def parse(cls, text: str) -> Sweep:
        """`m=3,5,7,10`, `tau=0.6,0.8,1.0` or `strategy=ladder,fixed,nucleus`."""
        name, _, raw = text.partition("=")
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        if name not in SWEEPABLE or not parts:
            raise ValueError(f"--sweep {text!r}: expected NAME=V1,V2,... with NAME one of {SWEEPABLE}")
        try:
            if name == "m":
                values: tuple[Any, ...] = tuple(int(p) for p in parts)
                if not all(1 <= v <= MAX_M for v in values):
                    raise ValueError
            elif name == "tau":
                values = tuple(float(p) for p in parts)
                if not all(0 <= v <= 1 for v in values):
                    raise ValueError
            else:
                values = tuple(parts)
                if not set(values) <= set(STRATEGIES):
                    raise ValueError
        except ValueError:
            raise ValueError(f"--sweep {text!r}: bad value for {name}") from None
        return cls(name, values)


def take(items: Sequence[LabelledItem], limit: int | None) -> list[LabelledItem]:
    """The first `limit` items, taken in turn from each difficulty so every one keeps its share."""
    if limit is None or limit >= len(items):
        return list(items)
    groups: dict[str, list[LabelledItem]] = {}
    for item in items:
        groups.setdefault(item.difficulty, []).append(item)
    taken: list[LabelledItem] = []
    while len(taken) < limit:
        for group in groups.values():
            if group and len(taken) < limit:
                taken.append(group.pop(0))
    return taken


def rerouted(outcomes: Sequence[ItemOutcome], tau: float) -> list[ItemOutcome]:
    """The routed mode at another tau, from the forced runs: seeded samples make a routed item's
    answer and cost exactly those of the forced mode its consensus selects."""
    out = []
    for o in outcomes:
        chosen = o.runs["short" if o.consensus >= tau else o.long_mode]
        route = Route.SHORT if o.consensus >= tau else Route.LONG
        routed = ModeRun(chosen.answer, route, chosen.latency_ms, chosen.prompt_tokens, chosen.completion_tokens)
        out.append(replace(o, runs={"routed": routed, **{k: v for k, v in o.runs.items() if k != "routed"}}))
    return out


async def _evaluate(pipeline: RewardPipeline, items: Sequence[LabelledItem], config: EvalConfig) -> list[ItemOutcome]:
    desc = f"eval m={config.m} tau={config.tau} {config.strategy}"
    with tqdm(total=len(items), desc=desc, file=sys.stderr, unit="item") as bar:
        return await evaluate(pipeline, items, config, progress=lambda: bar.update(1))


async def run(
    pipeline: RewardPipeline,
    items: Sequence[LabelledItem],
    config: EvalConfig,
    sweep: Sweep | None = None,
    plot: Path | None = None,
) -> dict[str, Any]:
    """One report, or with a sweep one row per value (and the plot of the sweep)."""
    from egrm.evals.plots import plot_eval, plot_sweep

    if sweep is None:
        outcomes = await _evaluate(pipeline, items, config)
        report = summarise(outcomes, config)
        if config.load_clients > 0:
            loaded = items[: config.load_questions]
            print(f"load: {config.load_clients} clients, {len(loaded)} questions per policy", file=sys.stderr)
            report["load"] = await throughput(pipeline, loaded, config, config.load_clients, config.load_group)
        if plot is not None:
            plot_eval(outcomes, report, plot)
        return report
    rows = []
    if sweep.name == "tau":  # one run of each forced mode serves every threshold
        forced = replace(config, modes=tuple(m for m in config.modes if m != "routed") or ("short", "long"))
        if not {"short", "long"} <= set(forced.run_modes):
            raise ValueError("a tau sweep needs the short and long modes")
        outcomes = await _evaluate(pipeline, items, forced)
        for tau in sweep.values:
            rows.append({"tau": tau, **summarise(rerouted(outcomes, tau), replace(config, tau=tau))})
    else:
        for value in sweep.values:
            point = replace(config, **{sweep.name: value})
            rows.append({sweep.name: value, **summarise(await _evaluate(pipeline, items, point), point)})
    if plot is not None:
        plot_sweep(sweep.name, rows, plot)
    return {"sweep": sweep.name, "rows": rows}


TABLE_COLUMNS = (
    "accuracy_routed",
    "accuracy_always_short",
    "accuracy_always_long",
    "short_path_rate",
    "short_path_accuracy",
    "mean_consensus",
    "latency_ratio_routed_vs_long",
)


def table(report: dict[str, Any]) -> str:
    """A plain-text table: one row per sweep value, or one row for a single run."""
    rows = report.get("rows") or [report]
    key = report.get("sweep", "m")
    columns = [c for c in TABLE_COLUMNS if any(r.get(c) is not None for r in rows)]
    lines = [" | ".join([key, *columns])]
    for row in rows:
        cells = [str(row.get(key))] + ["-" if row.get(c) is None else f"{row[c]:.3f}" for c in columns]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def main(
    data: str,
    split: str,
    limit: int | None,
    config: EvalConfig,
    sweep: str | None,
    plot: Path | None,
    as_json: bool,
    template: str = "verdict",
) -> int:
    items = take(load_dataset(data, split), limit)
    parsed = Sweep.parse(sweep) if sweep else None
    if not set(config.modes) <= set(MODES):
        raise ValueError(f"--modes must be a subset of {MODES}")
    if config.load_clients < 0 or config.load_questions < 1 or config.load_group < 1:
        raise ValueError("--load-clients must be >= 0, --load-questions and --load-group >= 1")
    if not 0 <= config.long_accept <= 1 or not 1 <= config.long_window <= config.m:
        raise ValueError("--long-accept must be in [0, 1] and --long-window in [1, --m]")
    if template == "pairwise" and (parsed is not None or plot is not None):
        raise ValueError("--template pairwise reports pair accuracy alone: no --sweep, no --plot")

    async def go() -> dict[str, Any]:
        async with pipeline_from(Settings()) as pipeline:  # the served pipeline (EGRM_* settings)
            if template == "pairwise":
                with tqdm(total=len(items), desc="eval pairwise", file=sys.stderr, unit="pair") as bar:
                    return await evaluate_pairs(pipeline, items, config, progress=lambda: bar.update(1))
            return await run(pipeline, items, config, parsed, plot)

    report = asyncio.run(go())
    report = {"data": data, "split": split if data.startswith("builtin:") else None, **report}
    if template != "pairwise":
        print(table(report), file=sys.stderr)
    if as_json:
        print(json.dumps(report))
    return 0
