"""egrm's own share on the remote path: egrm over vLLM against the engine calls it made, replayed straight
to vLLM. Prints one JSON line.

1. Record: `egrm serve` (EGRM_ENGINE=openai, dialect vllm) talks to vLLM through a recording proxy;
   one client sends every request of every workload, one at a time, so each vLLM call belongs to
   the request in flight. A request's calls fall into waves: a call that starts before every
   earlier call of its request has ended runs beside them (the ladder), one that starts after
   waits for them (the long path's reasoning waits for the samples).
2. Time, per workload and concurrency: egrm straight to vLLM (no proxy), then the recorded calls
   replayed by a plain aiohttp client (egrm's own) with the same concurrency, wave after wave; at
   16 clients each twice (egrm, replay, replay, egrm). vLLM's prefix cache is emptied before each
   (POST /reset_prefix_cache, served in its dev mode), and the cores cool down (vLLM's engine
   spins a while after a call), so both start alike. Seeds fix every sample, so egrm's calls are
   the recorded ones.
3. Report: egrm's own time per one-item request at one client (p50, p90): its latency while
   recording outside every vLLM call; beside it, its latency against the replay's, each request
   and its replay back to back on a cold cache (noisier: two runs of vLLM);
   items/s at 16 clients, egrm vs replay; vLLM's prefix-cache hit rate over egrm's calls (from its
   /metrics); and, once vLLM is stopped, `egrm serve` on its embedded engine on the short workload
   at 16 clients (the same weights and dtype), the ratio a user gets by moving to vLLM here.

Workloads (each question its own, so nothing is read from egrm's question window):
- short: one-item /v1/rewards on the short path (5 ladder calls);
- long: one-item /v1/rewards on the long path (the ladder, then 5 reasoning continuations);
- grpo: P prompts x G responses, one item per POST, sharing on (one question's calls per group;
  the group's other POSTs join them, and in the replay wait for them). Only items/s: a joined
  answer is not a latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from egrm.config import Settings
from egrm.engines.embedded.loader import resolve_dtype
from egrm.factory import judge_model_path
from loadtest.serverproc import free_port, running_server, vllm_counters, vllm_server

SERVED = "judge"
PREFIX_CACHE = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
COOL_DOWN_S = 2.0
G = 8


@dataclass(slots=True)
class Call:
    start: float
    end: float
    body: dict[str, Any]


@dataclass(slots=True)
class Job:
    """One egrm request of a workload, and the vLLM calls it made, in waves."""

    workload: str
    body: dict[str, Any]
    group: int | None = None  # GRPO: the question it shares with the other responses of its group
    calls: list[Call] = field(default_factory=list)
    latency_ms: float = 0.0  # as the client saw it while recording

    @property
    def own_ms(self) -> float:
        """egrm's own time: its latency outside every vLLM call (the union of the calls' spans as
        the proxy saw them, its own work included)."""
        busy, reach = 0.0, float("-inf")
        for call in sorted(self.calls, key=lambda c: c.start):
            busy += max(0.0, call.end - max(call.start, reach))
            reach = max(reach, call.end)
        return self.latency_ms - busy * 1000

    @property
    def waves(self) -> list[list[dict[str, Any]]]:
        waves: list[list[Call]] = []
        for call in sorted(self.calls, key=lambda c: c.start):
            if waves and call.start < min(c.end for c in waves[-1]):
                waves[-1].append(call)
            else:
                waves.append([call])
        return [[c.body for c in wave] for wave in waves]


def short_job(i: int, path: str) -> Job:
    a, b = 13 + (7 * i) % 83, 4 + (11 * i) % 89
    item = {"prompt": f"What is {a} + {b}? (case {i})", "response": str(a + b + i % 2)}
    return Job(path, {"items": [item], "options": {"path": path, "seed": i}})


def grpo_jobs(prompts: int, first: int) -> list[Job]:
    jobs = []
    for p in range(first, first + prompts):
        a, b = 12 + (13 * p) % 80, 3 + p % 9
        for k in range(G):
            answer = a * b + (0 if k % 2 == 0 else (1, -1, 10, -10)[(k // 2) % 4])
            item = {"prompt": f"What is {a} * {b}? (group {p})", "response": f"The answer is {answer}."}
            jobs.append(Job("grpo", {"items": [item], "options": {"seed": p}}, group=p))
    return jobs


class Recorder:
    """A proxy in front of vLLM that files each POST it forwards under the job in flight. A plain
    ASGI app: a call's span runs from the moment the proxy has the request to the moment it has
    handed back the answer, so the proxy's own work counts as the call's, not as egrm's."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.current: Job | None = None
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        start = time.perf_counter()
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        content = b"".join(chunks)
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.upstream, timeout=300)
        answer = await self._client.request(
            scope["method"], scope["path"], content=content, headers={"content-type": "application/json"}
        )
        headers = [(b"content-type", answer.headers.get("content-type", "application/json").encode())]
        await send({"type": "http.response.start", "status": answer.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": answer.content})
        if scope["method"] == "POST" and self.current is not None:
            self.current.calls.append(Call(start, time.perf_counter(), json.loads(content)))


@contextmanager
def in_thread(app: ASGIApp) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def egrm_env(model: str, openai_url: str) -> dict[str, str]:
    return {
        "EGRM_ENGINE": "openai",
        "EGRM_OPENAI_URL": f"{openai_url}/v1",
        "EGRM_OPENAI_DIALECT": "vllm",
        "EGRM_OPENAI_MODEL": SERVED,
        "EGRM_MODEL": model,
    }


def record(jobs: list[Job], model: str, vllm: str) -> None:
    recorder = Recorder(vllm)
    # One client, its connection kept alive: a new httpx client per request costs ~60 ms here.
    with in_thread(recorder) as proxy, running_server(egrm_env(model, proxy)) as url, httpx.Client() as client:
        for job in jobs:
            recorder.current = job
            start = time.perf_counter()
            r = client.post(f"{url}/v1/rewards", json=job.body, timeout=300)
            job.latency_ms = (time.perf_counter() - start) * 1000
            r.raise_for_status()
            recorder.current = None


def cold(vllm: str | None) -> None:
    """Empty vLLM's prefix cache and let the cores cool down."""
    if vllm is not None:
        httpx.post(f"{vllm}/reset_prefix_cache", timeout=60).raise_for_status()
    time.sleep(COOL_DOWN_S)


async def closed_loop(jobs: list[Job], clients: int, send) -> tuple[list[float], float]:  # type: ignore[no-untyped-def]
    """Run every job once, `clients` at a time; each job's latency (ms) in job order, and the wall (s).
    The client is aiohttp, as egrm's own backend client: the replay costs no more CPU than egrm's calls."""
    latencies = [0.0] * len(jobs)
    order = iter(range(len(jobs)))
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as client:

        async def worker() -> None:
            for i in order:
                start = time.perf_counter()
                await send(client, jobs[i])
                latencies[i] = (time.perf_counter() - start) * 1000

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return latencies, time.perf_counter() - start


async def post(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST JSON and read the JSON answer (as egrm must read vLLM's); fail on an error status."""
    async with client.post(url, json=body) as answer:
        text = await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{url} answered {answer.status}: {text[:300]!r}")
        return json.loads(text)  # type: ignore[no-any-return]


def via_egrm(url: str, usage: dict[str, int] | None = None):  # type: ignore[no-untyped-def]
    """Send each job to egrm; add up the usage egrm reports (its calls' prompt and cached tokens)."""

    async def send(client: aiohttp.ClientSession, job: Job) -> None:
        answer = await post(client, f"{url}/v1/rewards", job.body)
        assert all(x["error"] is None for x in answer["results"]), answer
        if usage is not None:
            for key, value in answer["usage"].items():
                usage[key] = usage.get(key, 0) + value

    return send


def replayed(vllm: str):  # type: ignore[no-untyped-def]
    """Each job's calls, wave after wave. A job that made none shares its group's: it waits for the
    job that made them, as egrm's joined request waits for the work it joined."""
    groups: dict[int, asyncio.Future[None]] = {}

    async def calls(client: aiohttp.ClientSession, job: Job) -> None:
        for wave in job.waves:
            await asyncio.gather(*(post(client, f"{vllm}/v1/completions", b) for b in wave))

    async def send(client: aiohttp.ClientSession, job: Job) -> None:
        if job.group is None:
            await calls(client, job)
        elif job.calls:
            groups[job.group] = asyncio.ensure_future(calls(client, job))
            await groups[job.group]
        else:
            await groups[job.group]

    return send


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def paired(jobs: list[Job], egrm: str, vllm: str) -> dict[str, Any]:
    """One client: each job through egrm, then its calls replayed, each on a cold cache."""
    ours: list[float] = []
    theirs: list[float] = []
    usage: dict[str, int] = {}
    for job in jobs:
        for send, out in ((via_egrm(egrm, usage), ours), (replayed(vllm), theirs)):
            cold(vllm)
            out.append(asyncio.run(closed_loop([job], 1, send))[0][0])
    added = [a - b for a, b in zip(ours, theirs, strict=True)]
    own = [j.own_ms for j in jobs]
    return {
        "items": len(jobs),
        "clients": 1,
        "calls": sum(len(j.calls) for j in jobs),
        "egrm_p50_ms": round(statistics.median(ours), 1),
        "replay_p50_ms": round(statistics.median(theirs), 1),
        "vs_replay_p50_ms": round(statistics.median(added), 1),
        # egrm's latency outside vLLM's calls, from the recording (precise: no second run's noise).
        "own_p50_ms": round(statistics.median(own), 1),
        "own_p90_ms": round(percentile(own, 0.9), 1),
        # What vLLM answered egrm's calls with (usage.prompt_tokens_details), each job on a cold cache.
        "prefix_cache_hit_rate": round(usage["cached_prompt_tokens"] / usage["prompt_tokens"], 3),
    }


def side_by_side(jobs: list[Job], clients: int, model: str, vllm: str) -> dict[str, Any]:
    """egrm and the replay of the same jobs, each twice (egrm, replay, replay, egrm: drift hits
    both alike), each on a cold cache, egrm a fresh `egrm serve` each time (the same questions
    again would be read from its question window: a cached answer is not a throughput); vLLM's hit
    rate over egrm's calls."""
    walls: dict[str, float] = {"egrm": 0.0, "replay": 0.0}
    queries = hits = 0.0
    for name in ("egrm", "replay", "replay", "egrm"):
        with ExitStack() as stack:
            if name == "egrm":
                send = via_egrm(stack.enter_context(running_server(egrm_env(model, vllm))))
            else:
                send = replayed(vllm)
            cold(vllm)
            before = vllm_counters(vllm, *PREFIX_CACHE)
            walls[name] += asyncio.run(closed_loop(jobs, clients, send))[1]
        if name == "egrm":
            after = vllm_counters(vllm, *PREFIX_CACHE)
            queries += after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
            hits += after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    return {
        "items": len(jobs),
        "clients": clients,
        "calls": sum(len(j.calls) for j in jobs),
        "egrm_items_per_s": round(2 * len(jobs) / walls["egrm"], 2),
        "replay_items_per_s": round(2 * len(jobs) / walls["replay"], 2),
        "items_per_s_ratio": round(walls["replay"] / walls["egrm"], 3),
        "prefix_cache_hit_rate": round(hits / queries, 3) if queries else None,
    }


def embedded_items_per_s(jobs: list[Job], clients: int, model: str, dtype: str) -> float:
    with running_server({"EGRM_MODEL": model, "EGRM_DTYPE": dtype}) as url:
        asyncio.run(closed_loop(jobs[:2], 1, via_egrm(url)))  # warm-up
        cold(None)
        _, wall = asyncio.run(closed_loop(jobs, clients, via_egrm(url)))
    return len(jobs) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=16, help="one-item short-path requests at one client")
    parser.add_argument("--long", type=int, default=8, help="one-item long-path requests at one client")
    parser.add_argument("--grpo", type=int, default=8, help=f"prompts of {G} responses at 16 clients")
    parser.add_argument("--dtype", default="auto", help="vLLM's and the embedded engine's dtype")
    parser.add_argument("--vllm-url", help="a running vLLM serving the judge as 'judge', in dev mode")
    args = parser.parse_args()
    settings = Settings()
    model = str(judge_model_path(settings))
    dtype = resolve_dtype(args.dtype)
    plan = {
        ("short", 1): [short_job(i, "short") for i in range(args.short)],
        ("short", 16): [short_job(i, "short") for i in range(1000, 1000 + 4 * args.short)],
        ("long", 1): [short_job(i, "long") for i in range(2000, 2000 + args.long)],
        ("long", 16): [short_job(i, "long") for i in range(3000, 3000 + 4 * args.long)],
        ("grpo", 16): grpo_jobs(args.grpo, 4000),
    }

    def measure(vllm: str) -> dict[str, Any]:
        httpx.post(f"{vllm}/v1/completions", json={"model": SERVED, "prompt": [1, 2, 3], "max_tokens": 2}, timeout=300)
        record([job for jobs in plan.values() for job in jobs], model, vllm)
        runs = {}
        for (w, c), jobs in plan.items():
            if c == 1:
                with running_server(egrm_env(model, vllm)) as egrm:
                    runs[f"{w}_c1"] = paired(jobs, egrm, vllm)
            else:
                runs[f"{w}_c{c}"] = side_by_side(jobs, c, model, vllm)
        return runs

    if args.vllm_url:
        runs = measure(args.vllm_url)
    else:
        port = free_port()
        with vllm_server(judge_model_path(settings), settings.cache_dir, port, SERVED, dtype) as _:
            runs = measure(f"http://127.0.0.1:{port}")
    embedded = embedded_items_per_s(plan[("short", 16)], 16, model, dtype)
    hits = [r["prefix_cache_hit_rate"] for r in runs.values() if r["prefix_cache_hit_rate"] is not None]
    out = {
        "dtype": dtype,
        "runs": runs,
        "own_p50_ms": {k: v["own_p50_ms"] for k, v in runs.items() if k.endswith("_c1")},
        "own_p90_ms": {k: v["own_p90_ms"] for k, v in runs.items() if k.endswith("_c1")},
        "items_per_s_vs_replay_c16": {k: v["items_per_s_ratio"] for k, v in runs.items() if k.endswith("_c16")},
        "embedded_short_c16_items_per_s": round(embedded, 2),
        "vllm_vs_embedded_short_c16": round(runs["short_c16"]["egrm_items_per_s"] / embedded, 3),
        "prefix_cache_hit_rate_min": min(hits) if hits else None,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
