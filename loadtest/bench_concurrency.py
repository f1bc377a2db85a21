"""Throughput at concurrency 1 vs 16 against a real server, and the HTTP + pipeline overhead.

Prints one JSON line. Every request is one short-path item (M=5) with its own question, so no
two requests share more than the judge template. The overhead is, per request at concurrency
1, the client's latency minus the engine call the server timed (`timings.sample_ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from typing import Any

import httpx

from loadtest.serverproc import running_server

# Every request this process sends asks a question of its own (item() repeats none below 37 x 41):
# a question asked again, by a later run on the same server, would be read from its window.
_QUESTIONS = itertools.count()


def item(i: int) -> dict[str, str]:
    a, b = 11 + i % 37, 23 + (7 * i) % 41
    return {"prompt": f"What is {a} + {b}?", "response": str(a + b + (i % 3 == 0))}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one(
    client: httpx.AsyncClient, url: str, i: int, template: str, options: dict[str, Any] | None = None
) -> tuple[float, float, int]:
    """One request: client latency (ms), the engine time the server timed (ms), prompt tokens
    the engine had to compute (neither shared by the branches nor served by the prefix cache)."""
    body = {
        "items": [item(i)],
        "options": {"path": "short", "m": 5, "seed": i, "template": template, **(options or {})},
    }
    start = time.perf_counter()
    r = await client.post(f"{url}/v1/rewards", json=body, timeout=300)
    elapsed = (time.perf_counter() - start) * 1000
    r.raise_for_status()
    body = r.json()
    computed = body["usage"]["prompt_tokens"] - body["usage"]["cached_prompt_tokens"]
    return elapsed, body["results"][0]["timings"]["sample_ms"], computed


async def engine_counters(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    wanted = ("egrm_engine_batches_total", "egrm_engine_batched_requests_total")
    text = (await client.get(f"{url}/metrics")).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith(wanted)}


async def load(
    url: str, concurrency: int, requests: int, template: str, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Closed loop: `concurrency` clients send `requests` one-item requests in all; options join each."""
    latencies: list[float] = []
    overheads: list[float] = []
    computed = 0
    warm_up, *numbers = (next(_QUESTIONS) for _ in range(requests + 1))
    counter = iter(numbers)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal computed
        for i in counter:
            ms, engine_ms, prefilled = await one(client, url, i, template, options)
            computed += prefilled
            latencies.append(ms)
            overheads.append(ms - engine_ms)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as client:
        await one(client, url, warm_up, template, options)
        before = await engine_counters(client, url)
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
        after = await engine_counters(client, url)
    batches = after["egrm_engine_batches_total"] - before["egrm_engine_batches_total"]
    jobs = after["egrm_engine_batched_requests_total"] - before["egrm_engine_batched_requests_total"]
    return {
        "requests": requests,
        "rps": round(requests / wall, 2),
        "p50_ms": round(statistics.median(latencies), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "overhead_p50_ms": round(statistics.median(overheads), 2),
        "mean_engine_batch": round(jobs / batches, 2) if batches else None,
        # Prefill is compute-bound and batching does not amortise it: once this nears the
        # machine's prefill rate (bench_parallel: prefix_tokens / single sample), throughput is capped.
        "computed_prompt_tokens_per_request": round(computed / requests, 1),
        "computed_prompt_tokens_per_s": round(computed / wall),
    }


async def measure(url: str, requests: int, template: str) -> dict[str, Any]:
    c1 = await load(url, 1, requests, template)
    c16 = await load(url, 16, requests * 2, template)
    return {
        "template": template,
        "c1": c1,
        "c16": c16,
        "ratio_rps_c16_vs_c1": round(c16["rps"] / c1["rps"], 2),
        "overhead_p50_ms": c1["overhead_p50_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--requests", type=int, default=48, help="requests at concurrency 1 (twice that at 16)")
    parser.add_argument("--url", help="a running server; default: start one")
    parser.add_argument(
        "--template",
        default="verdict",
        help="judge template: verdict (solve first: two engine calls a request) or score (answer-only: one)",
    )
    args = parser.parse_args()
    if args.url:
        result = asyncio.run(measure(args.url, args.requests, args.template))
    else:
        with running_server() as url:
            result = asyncio.run(measure(url, args.requests, args.template))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
