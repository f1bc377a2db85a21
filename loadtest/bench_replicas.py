"""A GRPO step split over egrm replicas, with and without the Redis store they share: one JSON line.

N prompts x G responses (bench_grpo's workload: no seed, answers written several ways), sent as
OpenRLHF sends them, one query per POST, all at once; with two replicas the POSTs alternate between
them (as a Service spreads a trainer's reward workers), so every question reaches both, each group
starting on the next replica. Each setting
runs on fresh servers and a fresh redis-server, one setting at a time:

- one: one `egrm serve`, its in-process store (the baseline);
- one_redis: the same replica with EGRM_SHARE_URL (what the store costs where it saves nothing);
- two_alone: two replicas, each its own store (what a fleet did before: each question judged twice);
- two_redis: two replicas sharing Redis.

Two replicas on this machine share its cores: each runs one torch thread (two processes of two
threads on two cores slow each other down ~40x), the single replica all of them. Reports items/s,
questions judged (work computed), the largest reward spread among equal answers, rewards lost,
Redis calls and the stored work's size per question, and the ratios to one replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from contextlib import ExitStack
from typing import Any

import httpx
from redis import Redis

from loadtest.bench_grpo import Response, group, quality
from loadtest.serverproc import redis_server, server_process


async def alternating(urls: list[str], responses: list[Response]) -> list[float | None]:
    """One /get_reward POST per query, all at once, alternating between the replicas, each group
    starting on the next replica (as a Service spreads them: a question's first response, whose
    replica then computes it, does not always reach the same one)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    async def one(client: httpx.AsyncClient, k: int, r: Response) -> float | None:
        body = {"query": [r.query], "prompts": [r.prompt], "labels": [None]}
        url = urls[(k + r.question) % len(urls)]
        answer = await client.post(f"{url}/get_reward", json=body, timeout=180)
        return float(answer.json()["rewards"][0]) if answer.status_code == 200 else None

    async with httpx.AsyncClient(limits=limits) as client:
        return list(await asyncio.gather(*(one(client, k, r) for k, r in enumerate(responses))))


def total(urls: list[str], name: str) -> float:
    """A series summed over the replicas (0 where one does not export it)."""
    out = 0.0
    for url in urls:
        for line in httpx.get(f"{url}/metrics").text.splitlines():
            if line.startswith(name + " "):
                out += float(line.split()[1])
    return out


def stored_kb(url: str) -> float:
    """The mean size of a question's stored work in Redis, in KiB."""
    client = Redis.from_url(url)
    sizes = [client.strlen(key) for key in client.scan_iter("egrm:q:*")]
    client.close()
    return round(sum(sizes) / max(1, len(sizes)) / 1024, 1)


def setting(replicas: int, redis: bool, responses: list[Response], prompts: int) -> dict[str, Any]:
    with ExitStack() as stack:
        env = {"EGRM_THREADS": "1"} if replicas > 1 else {}
        if redis:
            url, _ = stack.enter_context(redis_server(maxmemory_mb=256))
            env["EGRM_SHARE_URL"] = url
        urls = [stack.enter_context(server_process(env))[0] for _ in range(replicas)]
        if redis and replicas > 1:
            time.sleep(2.5)  # every replica has seen the others (each says it is alive every 2 s)
        start = time.perf_counter()
        rewards = asyncio.run(alternating(urls, responses))
        wall = time.perf_counter() - start
        computed = 'egrm_shared_questions_total{outcome="miss"}'  # question work started
        if redis:
            computed = 'egrm_shared_store_total{outcome="computed"}'  # of that, what Redis did not give
        per_replica = [total([u], computed) for u in urls]
        alone = total(urls, 'egrm_shared_store_total{outcome="local"}') if redis else 0.0  # Redis failed
        out: dict[str, Any] = {
            "items_per_s": round(len(responses) / wall, 2),
            "wall_s": round(wall, 1),
            "questions_judged": sum(per_replica) + alone,
            "judged_per_replica": per_replica,
        }
        if redis:
            out["stored_kb_per_question"] = stored_kb(env["EGRM_SHARE_URL"])
            out["redis_calls_per_question"] = round(total(urls, "egrm_shared_store_calls_total") / prompts, 1)
            out["store_errors"] = total(urls, "egrm_shared_store_errors_total")
    return {**out, **quality(responses, rewards)}


def store_cost(prompts: int, size: int, pairs: int) -> dict[str, Any]:
    """What Redis costs a replica where it saves nothing: one replica without it and with it, in
    ABBA order (the machine drifts 10-20% between runs), each pair's items/s ratio and the median."""
    responses = [r for i in range(prompts) for r in group(i, size)]
    ratios = []
    for n in range(pairs):
        order = (False, True) if n % 2 == 0 else (True, False)
        rate = {redis: setting(1, redis, responses, prompts)["items_per_s"] for redis in order}
        ratios.append(round(rate[True] / rate[False], 3))
    return {"ratio_items_per_s_one_redis_vs_one": ratios, "median": statistics.median(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16, help="N prompts")
    parser.add_argument("--group", type=int, default=8, help="G responses per prompt")
    parser.add_argument(
        "--store-cost-pairs",
        type=int,
        default=0,
        help="instead: one replica without and with Redis, N times each in ABBA order, and each pair's ratio",
    )
    args = parser.parse_args()
    runs: dict[str, Any] = {"prompts": args.prompts, "group_size": args.group}
    if args.store_cost_pairs:
        print(json.dumps({**runs, **store_cost(args.prompts, args.group, args.store_cost_pairs)}))
        return
    settings = {"one": (1, False), "one_redis": (1, True), "two_alone": (2, False), "two_redis": (2, True)}
    # The same questions in every setting (fresh servers and a fresh Redis each: nothing carries
    # over), seeded from their keys: every setting computes the same work.
    responses = [r for i in range(args.prompts) for r in group(i, args.group)]
    for name, (replicas, redis) in settings.items():
        runs[name] = setting(replicas, redis, responses, args.prompts)
    base = runs["one"]["items_per_s"]
    for name in ("one_redis", "two_alone", "two_redis"):
        runs[f"ratio_items_per_s_{name}_vs_one"] = round(runs[name]["items_per_s"] / base, 3)
    runs["ratio_items_per_s_two_redis_vs_two_alone"] = round(
        runs["two_redis"]["items_per_s"] / runs["two_alone"]["items_per_s"], 3
    )
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
