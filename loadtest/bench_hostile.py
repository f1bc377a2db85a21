"""One hostile request beside polite ones, against a fresh server: prints one JSON line.

The hostile request: many items of long prompts, many samples each, forced to the long path, under
the server's request deadline. Polite requests are one-item short-path requests, each a question
never asked before (a repeated question is read from the question window: that is measured apart,
as `window_hit_ms`, and is not a latency of the engine):
- unloaded: one client, alone, on an idle server (between the two hostile episodes, once the first one's work is gone);
- beside: one client, while the hostile request runs (until its answer, 504 or 429);
- grace: one client, for `--grace-window-s` after that answer, while its work may still run in its
  grace (nobody waits for it: it must yield to live work);
- after: once no question work runs any more (the hostile work finished, or dropped at its grace's end).
Every polite answer is counted by status: none may be refused (429) while the hostile one runs or
in its grace. The hostile request is sent twice: on a fresh server (too few questions finished
for a throughput estimate: it is admitted and runs to its deadline), then again (admission knows
the rate by then); the unloaded baseline is measured between the two, once the engine is idle.
Reports medians and their ratios to unloaded, the engine's background steps and the question
work dropped at the end of its grace, how long until no work runs, and the peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from loadtest.serverproc import server_process

_fresh = itertools.count(1)


def polite_body() -> dict[str, Any]:
    """A one-item short-path request on a question never asked before."""
    i = next(_fresh)
    a, b = 11 + (37 * i) % 89, 13 + (53 * i) % 83
    return {
        "items": [{"prompt": f"What is {a} + {b}? (polite {i})", "response": str(a + b)}],
        "options": {"path": "short"},
    }


def vm(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


async def metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    for line in (await client.get(f"{url}/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


async def timed(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, int]:
    start = time.perf_counter()
    r = await client.post(f"{url}/v1/rewards", json=body, timeout=600)
    return (time.perf_counter() - start) * 1000, r.status_code


async def polite_until(client: httpx.AsyncClient, url: str, done: Any) -> tuple[list[float], Counter[int]]:
    """One polite client, fresh questions, until done() is true: latencies of the answered ones."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    while not done():
        ms, status = await timed(client, url, polite_body())
        statuses[status] += 1
        if status == 200:
            latencies.append(ms)
        else:
            await asyncio.sleep(0.2)
    return latencies, statuses


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


async def episode(client: httpx.AsyncClient, url: str, big: dict[str, Any], grace_window_s: float) -> dict[str, Any]:
    """The hostile request once, polite clients beside it and in its grace."""
    background = await metric(client, url, "egrm_engine_background_steps_total")
    hostile = asyncio.ensure_future(timed(client, url, big))
    await asyncio.sleep(1.0)  # the big one is in
    beside, beside_status = await polite_until(client, url, hostile.done)
    big_ms, big_status = await hostile
    answered = time.perf_counter()
    grace, grace_status = await polite_until(client, url, lambda: time.perf_counter() - answered > grace_window_s)
    out: dict[str, Any] = {
        "hostile_status": big_status,
        "hostile_ms": round(big_ms),
        "polite_beside_ms": median(beside),
        "polite_in_grace_ms": median(grace),
        "polite_statuses_beside": dict(beside_status),
        "polite_statuses_in_grace": dict(grace_status),
        "polite_refused": beside_status[429] + grace_status[429],
        "polite_timed_out": beside_status[504] + grace_status[504],
        "background_steps": await metric(client, url, "egrm_engine_background_steps_total") - background,
    }
    return out


def with_ratios(out: dict[str, Any], unloaded: float) -> dict[str, Any]:
    for name in ("beside", "in_grace"):
        value = out[f"polite_{name}_ms"]
        out[f"ratio_polite_{name}_vs_unloaded"] = round(value / unloaded, 2) if value else None
    return out


async def back_to_idle(client: httpx.AsyncClient, url: str) -> float:
    """Milliseconds until no question work runs any more (finished, or dropped at the end of its
    grace; reported as it is after a minute). The KV in use is no measure of it: finished work
    kept in the window holds its branches' KV until the pool needs it."""
    start = time.perf_counter()
    while await metric(client, url, "egrm_shared_questions_running") > 0 and time.perf_counter() - start < 60:
        await asyncio.sleep(0.05)
    return (time.perf_counter() - start) * 1000


async def run(
    url: str, pid: int, items: int, digits: int, m: int, rounds: int, grace_window_s: float
) -> dict[str, Any]:
    big = {
        "items": [{"prompt": "Add up: " + "7" * digits + f" ({i})", "response": str(i)} for i in range(items)],
        "options": {"m": m, "path": "long"},
    }
    async with httpx.AsyncClient() as client:
        await timed(client, url, polite_body())  # warm-up
        window = polite_body()
        await timed(client, url, window)
        window_hit = [(await timed(client, url, window))[0] for _ in range(rounds)]  # read from the window
        # First on a server that has finished too few questions to know its rate: the hostile
        # request is admitted and runs to its deadline. The unloaded baseline comes after it,
        # once its work is gone (an unloaded server is one with nothing left running).
        first = await episode(client, url, big, grace_window_s)
        first["idle_after_ms"] = round(await back_to_idle(client, url), 1)
        small = statistics.median([(await timed(client, url, polite_body()))[0] for _ in range(rounds)])
        second = await episode(client, url, big, grace_window_s)  # admission knows the rate now
        second["idle_after_ms"] = round(await back_to_idle(client, url), 1)
        after = [(await timed(client, url, polite_body()))[0] for _ in range(rounds)]
        dropped = await metric(client, url, "egrm_shared_questions_dropped_total")
        capacity = await metric(client, url, "egrm_engine_kv_capacity_bytes")
    return {
        "hostile": {"items": items, "prompt_digits": digits, "m": m},
        "polite_unloaded_ms": round(small, 1),
        "window_hit_ms": median(window_hit),
        "first": with_ratios(first, small),
        "second": with_ratios(second, small),
        "polite_after_ms": median(after),
        "ratio_polite_after_vs_unloaded": round(statistics.median(after) / small, 2),
        "question_work_dropped_at_grace_end": dropped,
        "kv_capacity_mb": round(capacity / 2**20),
        "peak_rss_mb": round(vm(pid, "VmHWM")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=256)
    parser.add_argument("--digits", type=int, default=3800, help="prompt length in digits (a token each)")
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=20, help="EGRM_REQUEST_TIMEOUT_S of the server")
    parser.add_argument("--grace-window-s", type=float, default=10, help="polite requests after the hostile answer")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = {"EGRM_REQUEST_TIMEOUT_S": str(args.timeout_s)}
    with server_process(env) as (url, proc):
        result = asyncio.run(run(url, proc.pid, args.items, args.digits, args.m, args.rounds, args.grace_window_s))
    print(json.dumps({"request_timeout_s": args.timeout_s, **result}))


if __name__ == "__main__":
    main()
