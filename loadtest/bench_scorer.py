"""What the scorer costs: one call with 5 candidates to the scorer worker (`egrm scorer`, over
loopback HTTP) and in-process, beside a long-path request's own latency, in one run.

Prints one JSON line. The candidates are real long-path candidates of the judge (the held-out
scorer data); the long-path requests go to a real `egrm serve` started here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import httpx

from egrm.scorer.model import TrainedScorer
from egrm.training.scorer_data import read
from loadtest.bench_latency import ITEMS, timed_post
from loadtest.serverproc import egrm_process, running_server

DATA = Path(__file__).resolve().parents[1] / "data" / "scorer" / "test.jsonl"


def percentiles(ms: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(ms, n=10)
    return {"p50_ms": round(statistics.median(ms), 3), "p90_ms": round(cuts[8], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200, help="scorer calls of 5 candidates each")
    parser.add_argument("--long-runs", type=int, default=5, help="long-path requests")
    args = parser.parse_args()
    candidates = [item.candidates[:5] for item in read(DATA)]
    batches = [[asdict(c) for c in five] for five in candidates]
    scorer = TrainedScorer.load()

    in_process = []
    for i in range(args.calls):
        start = time.perf_counter()
        scorer.predict(candidates[i % len(candidates)])
        in_process.append((time.perf_counter() - start) * 1000)

    worker = []
    with egrm_process("scorer") as (url, _), httpx.Client(base_url=url) as client:
        client.post("/v1/score", json={"candidates": batches[0]}).raise_for_status()  # warm-up
        for i in range(args.calls):
            start = time.perf_counter()
            client.post("/v1/score", json={"candidates": batches[i % len(batches)]}).raise_for_status()
            worker.append((time.perf_counter() - start) * 1000)

    long = []
    with running_server() as url, httpx.Client() as client:
        timed_post(client, url, ITEMS[0], "long", 0)  # warm-up
        for i in range(args.long_runs):
            long.append(timed_post(client, url, ITEMS[i % len(ITEMS)], "long", i))

    result = {
        "candidates_per_call": 5,
        "calls": args.calls,
        "worker": percentiles(worker),
        "in_process": percentiles(in_process),
        "long_path_request": {"p50_ms": round(statistics.median(long), 1), "runs": args.long_runs},
        "ratio_worker_p50_vs_long_path": round(statistics.median(worker) / statistics.median(long), 4),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
