"""Latency of one M=5 short-path request and one long-path request, against a real server.

Prints one JSON line. Requests alternate short/long so both see the same machine state.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx

from loadtest.serverproc import running_server

ITEMS = [
    {"prompt": "What is 17 + 25?", "response": "42"},
    {"prompt": "What is the capital of Australia?", "response": "Sydney"},
    {"prompt": "Is 91 a prime number?", "response": "No, 91 = 7 x 13."},
]


def timed_post(client: httpx.Client, url: str, item: dict, path: str, seed: int) -> float:
    body = {"items": [item], "options": {"path": path, "m": 5, "seed": seed}}
    start = time.perf_counter()
    r = client.post(f"{url}/v1/rewards", json=body, timeout=300)
    elapsed = time.perf_counter() - start
    r.raise_for_status()
    assert r.json()["results"][0]["route"] == path
    return elapsed * 1000


def summary(ms: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(ms), 1), "min_ms": round(min(ms), 1), "max_ms": round(max(ms), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=6, help="requests per path")
    parser.add_argument("--url", help="a running server; default: start one")
    args = parser.parse_args()

    def measure(url: str) -> dict:
        short: list[float] = []
        long: list[float] = []
        with httpx.Client() as client:
            timed_post(client, url, ITEMS[0], "short", 0)  # warm-up
            for i in range(args.runs):
                item = ITEMS[i % len(ITEMS)]
                short.append(timed_post(client, url, item, "short", i))
                long.append(timed_post(client, url, item, "long", i))
        return {
            "m": 5,
            "runs": args.runs,
            "short": summary(short),
            "long": summary(long),
            "ratio_long_vs_short": round(statistics.median(long) / statistics.median(short), 2),
        }

    if args.url:
        result = measure(args.url)
    else:
        with running_server() as url:
            result = measure(url)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
