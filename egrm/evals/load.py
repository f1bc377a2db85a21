"""Cost as a trainer pays it: items/s per policy under concurrent load, in GRPO's shape.

A GRPO trainer sends each prompt with its G responses at once, from many workers. Here each
question of the set becomes a group (its own response, then the true result and near misses, as
bare numbers), `clients` clients send one group per request (veRL's batch shape) until all are
judged, and the pipeline shares each question's work among its group (as served). One policy at a
time: always short first (it also warms the prefix cache for the others), then routed, the long
path with early stop, and always long (every candidate to the end: the baseline the others are
held against). Each run draws its own seeds, so no policy reads work another one left.

What a policy costs under load is the compute it asks for, so items/s here, not one item's
latency, is what routing and early stop must save.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from egrm.evals.data import LabelledItem, near_miss
from egrm.evals.harness import EvalConfig
from egrm.evals.report import NAMES
from egrm.pipeline.service import RewardPipeline

POLICIES = ("short", "routed", "early", "long")
_SEEDS = 5_000  # past the serial runs' seeds (seed + 10_000 * index): other question work


def groups(items: Sequence[LabelledItem], size: int, seed: int = 0) -> list[list[LabelledItem]]:
    """One group per item: the item, then size - 1 responses to its question that alternate the
    true result and a near miss (builtin items; an item without a known result is a group alone)."""
    rng = random.Random(seed)
    out = []
    for item in items:
        group = [item]
        if item.truth is not None:
            for k in range(1, size):
                value = item.truth if k % 2 else near_miss(item.truth, rng)
                gold = "Yes" if value == item.truth else "No"
                group.append(replace(item, id=f"{item.id}/{k}", response=str(value), proposed=value, gold=gold))
        out.append(group)
    return out


async def run_policy(
    pipeline: RewardPipeline, batch: list[list[LabelledItem]], config: EvalConfig, mode: str, clients: int
) -> dict[str, Any]:
    """All groups through one policy, `clients` requests in flight at a time."""
    todo = list(enumerate(batch))
    judged: list[tuple[LabelledItem, Any]] = []
    latencies: list[float] = []  # ms per group request

    async def client() -> None:
        while todo:
            index, group = todo.pop(0)
            options = config.options(mode, group[0].template, config.seed + 10_000 * index + _SEEDS)
            # What the trainer asks for: no samples returned, no estimate the policy does not read.
            options = replace(options, return_samples=False, with_exact=False, extra_always=0)
            sent = time.perf_counter()
            results = await pipeline.score([i.judge_item() for i in group], options)
            latencies.append((time.perf_counter() - sent) * 1000)
            judged.extend(zip(group, results, strict=True))

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - start
    return {
        "items_per_s": round(len(judged) / wall, 3),
        "wall_s": round(wall, 1),
        # A trainer's step waits for its slowest group: the tail of a group request's latency.
        "request_p50_ms": round(statistics.median(latencies)),
        "request_p90_ms": round(statistics.quantiles(latencies, n=10)[-1]) if len(latencies) > 1 else None,
        "completion_tokens_per_item": round(statistics.fmean(r.usage.completion_tokens for _, r in judged), 1),
        "accuracy": round(statistics.fmean(r.answer == i.gold for i, r in judged), 4),
        "errors": sum(r.error is not None for _, r in judged),
    }


async def throughput(
    pipeline: RewardPipeline, items: Sequence[LabelledItem], config: EvalConfig, clients: int, group: int
) -> dict[str, Any]:
    """Each policy of config.run_modes under load: items/s, tokens and accuracy, side by side."""
    batch = groups(items, group, config.seed)
    policies = [m for m in POLICIES if m in config.run_modes]
    runs = {NAMES[m]: await run_policy(pipeline, batch, config, m, clients) for m in policies}
    out: dict[str, Any] = {"clients": clients, "group": group, "questions": len(batch), "policies": runs}
    if "always_long" in runs:
        base = runs["always_long"]["items_per_s"]
        out["items_per_s_vs_always_long"] = {name: round(r["items_per_s"] / base, 3) for name, r in runs.items()}
    return out
