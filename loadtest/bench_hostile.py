"""One hostile request beside a polite one, against a fresh server: prints one JSON line.

The hostile request: many items of long prompts, many samples each, forced to the long path, under
a request deadline. While it runs, a one-item request is sent a few times; its latency is compared
with the same request's unloaded latency measured in the same run. After the big request's
deadline the server's KV in use (egrm_engine_kv_bytes) is polled until it is back to idle, and a
one-item request is timed again. The server's peak RSS (VmHWM) is read at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest.serverproc import server_process

SMALL = {"items": [{"prompt": "What is 17 + 25?", "response": "42"}], "options": {"seed": 1}}


def vm(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


async def timed(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, int]:
    start = time.perf_counter()
    r = await client.post(f"{url}/v1/rewards", json=body, timeout=600)
    return (time.perf_counter() - start) * 1000, r.status_code


async def run(url: str, pid: int, items: int, digits: int, m: int, rounds: int) -> dict[str, Any]:
    big = {
        "items": [{"prompt": "Add up: " + "7" * digits + f" ({i})", "response": str(i)} for i in range(items)],
        "options": {"m": m, "path": "long"},
    }
    async with httpx.AsyncClient() as client:
        await timed(client, url, SMALL)  # warm-up
        unloaded = [(await timed(client, url, SMALL))[0] for _ in range(rounds)]
        idle_kv = metric((await client.get(f"{url}/metrics")).text, "egrm_engine_kv_bytes")
        hostile = asyncio.ensure_future(timed(client, url, big))
        await asyncio.sleep(2.0)  # the big one is in
        loaded = []
        for _ in range(rounds):
            ms, status = await timed(client, url, SMALL)
            assert status == 200, status
            loaded.append(ms)
        big_ms, big_status = await hostile
        freed_at = time.perf_counter()
        while metric((await client.get(f"{url}/metrics")).text, "egrm_engine_kv_bytes") > idle_kv:
            if time.perf_counter() - freed_at > 60:
                break  # reported as it is: never back to idle within a minute
            await asyncio.sleep(0.05)
        freed_ms = (time.perf_counter() - freed_at) * 1000
        after, _ = await timed(client, url, SMALL)
        capacity = metric((await client.get(f"{url}/metrics")).text, "egrm_engine_kv_capacity_bytes")
    small, small_loaded = statistics.median(unloaded), statistics.median(loaded)
    return {
        "hostile": {"items": items, "prompt_digits": digits, "m": m, "status": big_status, "ms": round(big_ms)},
        "small_unloaded_ms": round(small, 1),
        "small_beside_hostile_ms": round(small_loaded, 1),
        "ratio_small_beside_hostile_vs_unloaded": round(small_loaded / small, 2),
        "kv_back_to_idle_after_deadline_ms": round(freed_ms, 1),
        "small_after_ms": round(after, 1),
        "kv_capacity_mb": round(capacity / 2**20),
        "peak_rss_mb": round(vm(pid, "VmHWM")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=256)
    parser.add_argument("--digits", type=int, default=3800, help="prompt length in digits (a token each)")
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=20, help="EGRM_REQUEST_TIMEOUT_S of the server")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    env = {"EGRM_REQUEST_TIMEOUT_S": str(args.timeout_s)}
    with server_process(env) as (url, proc):
        result = asyncio.run(run(url, proc.pid, args.items, args.digits, args.m, args.rounds))
    print(json.dumps({"request_timeout_s": args.timeout_s, **result}))


if __name__ == "__main__":
    main()
