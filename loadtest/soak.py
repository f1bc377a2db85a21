"""Steady load against a fresh server for a set time: RSS at start and end, errors, latency.

Prints one JSON line. A closed loop of `--concurrency` clients, each sending one-item requests
(auto routing; questions drawn from about 9,600, so most are new) back to back; the server's RSS,
the shared question work it keeps (egrm_shared_questions_bytes, against EGRM_SHARE_MAX_MB) and
the KV pool in use are read every 10 s. Before the load, the unloaded latency of a request forced
to the long path is measured on the same server (median of three), and p90 under load is
reported against it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from loadtest.serverproc import server_process


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def item(rng: random.Random) -> dict[str, str]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    return {"prompt": f"What is {a} + {b}?", "response": str(a + b + rng.choice([0, 0, 1, 10]))}


async def soak(url: str, pid: int, duration_s: float, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    routes: Counter[str] = Counter()
    rss = [rss_mb(pid)]
    shared_mb: list[float] = []
    kv_mb: list[float] = []
    stop_at = time.monotonic() + duration_s

    async def client(seed: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(seed)
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            try:
                r = await http.post(f"{url}/v1/rewards", json={"items": [item(rng)]}, timeout=300)
                statuses[str(r.status_code)] += 1
                if r.status_code == 200:
                    routes[r.json()["results"][0]["route"]] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
            latencies.append((time.perf_counter() - start) * 1000)

    async def sample_rss() -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(10)
            rss.append(rss_mb(pid))
            shared_mb.append(await asyncio.to_thread(gauge, url, "egrm_shared_questions_bytes") / 2**20)
            kv_mb.append(await asyncio.to_thread(gauge, url, "egrm_engine_kv_bytes") / 2**20)

    async with httpx.AsyncClient() as http:
        await asyncio.gather(sample_rss(), *(client(i, http) for i in range(concurrency)))
    rss.append(rss_mb(pid))
    ordered = sorted(latencies)
    errors = sum(n for status, n in statuses.items() if status != "200")
    return {
        "duration_s": duration_s,
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors,
        "statuses": dict(statuses),
        "routes": dict(routes),
        "rps": round(len(latencies) / duration_s, 2),
        "p50_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 1),
        "rss_mb_start": round(rss[0], 1),
        "rss_mb_end": round(rss[-1], 1),
        "rss_mb_max": round(max(rss), 1),
        "rss_mb_every_60s": [round(x) for x in rss[::6]],
        "shared_mb_max": round(max(shared_mb, default=0.0), 1),
        "shared_mb_every_60s": [round(x, 1) for x in shared_mb[::6]],
        "shared_entries_end": int(gauge(url, "egrm_shared_questions_entries")),
        "kv_pool_mb_in_use_every_60s": [round(x) for x in kv_mb[::6]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with server_process() as (url, proc):
        httpx.post(f"{url}/v1/rewards", json={"items": [item(random.Random(0))]}, timeout=300)  # warm-up
        long = []
        for seed in range(3):
            body = {"items": [item(random.Random(seed))], "options": {"path": "long", "seed": seed}}
            start = time.perf_counter()
            httpx.post(f"{url}/v1/rewards", json=body, timeout=300).raise_for_status()
            long.append((time.perf_counter() - start) * 1000)
        result = asyncio.run(soak(url, proc.pid, args.duration, args.concurrency))
    unloaded = statistics.median(long)
    result |= {
        "unloaded_long_ms": round(unloaded, 1),
        "ratio_p90_vs_unloaded_long": round(result["p90_ms"] / unloaded, 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
