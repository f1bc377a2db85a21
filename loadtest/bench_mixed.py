"""A mixed workload against a real server: one-item requests, 80% on the short path and 20% on the
long path, each forced (`options.path`): the routing policy decides nothing here, so the mix is
the one reported.

Prints one JSON line, every figure from one run:
- unloaded latency of a short and of a long request (alternating, alone, medians);
- a closed loop at concurrency 1 and 16: items/s and p50/p90/p99, overall and per kind;
- roofline_fraction at concurrency 16: the model FLOP/s the server achieved (2 x the layer and
  head parameters per token it computed, attention left out: small at these lengths) against the
  peak this CPU reaches in plain torch.mm calls of the model's own shapes, timed in this process
  at the server's dtype and thread count while the server is idle.
This is the baseline the engine rewrite (one step for every live branch) is measured against.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import httpx
import torch

from egrm.config import Settings
from egrm.engines.embedded.loader import resolve_dtype
from loadtest.serverproc import running_server

LONG_EVERY = 5  # every fifth request is forced to the long path: 20%


def item(i: int) -> dict[str, str]:
    a, b = 11 + (13 * i) % 83, 7 + (29 * i) % 89
    return {"prompt": f"What is {a} + {b}?", "response": str(a + b + (i % 4 == 0))}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def quantiles(values: list[float]) -> dict[str, float]:
    return {f"p{int(q * 100)}_ms": round(percentile(values, q), 1) for q in (0.5, 0.9, 0.99)}


async def one(client: httpx.AsyncClient, url: str, i: int, long: bool) -> tuple[float, int]:
    """One request: latency (ms) and the tokens the engine computed for it (prompt not served
    from cache, plus every generated token)."""
    options = {"seed": i, "path": "long" if long else "short"}
    start = time.perf_counter()
    r = await client.post(f"{url}/v1/rewards", json={"items": [item(i)], "options": options}, timeout=600)
    elapsed = (time.perf_counter() - start) * 1000
    r.raise_for_status()
    usage = r.json()["usage"]
    return elapsed, usage["prompt_tokens"] - usage["cached_prompt_tokens"] + usage["completion_tokens"]


async def unloaded(url: str, rounds: int) -> dict[str, float]:
    short: list[float] = []
    long: list[float] = []
    async with httpx.AsyncClient() as client:
        for k in range(rounds):
            short.append((await one(client, url, 50_000 + k, False))[0])
            long.append((await one(client, url, 60_000 + k, True))[0])
    return {"short_ms": round(statistics.median(short), 1), "long_ms": round(statistics.median(long), 1)}


async def closed_loop(url: str, concurrency: int, requests: int, first: int) -> dict[str, Any]:
    """Requests first, first + 1, ...: each run asks questions of its own (item() repeats none below
    83 x 89), since a question asked again would be read from the server's window."""
    latencies: dict[str, list[float]] = {"short": [], "long": []}
    computed = 0
    counter = iter(range(first, first + requests))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal computed
        for i in counter:
            kind = "long" if i % LONG_EVERY == 0 else "short"
            ms, tokens = await one(client, url, i, kind == "long")
            latencies[kind].append(ms)
            computed += tokens

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as client:
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    every = latencies["short"] + latencies["long"]
    return {
        "requests": requests,
        "items_per_s": round(requests / wall, 2),
        **quantiles(every),
        "long": {"count": len(latencies["long"]), **quantiles(latencies["long"])},
        "short": {"count": len(latencies["short"]), **quantiles(latencies["short"])},
        "computed_tokens_per_s": round(computed / wall, 1),
    }


def model_shapes() -> tuple[list[tuple[int, int]], int, int]:
    """(out, in) of each layer's projections as the lean forward fuses them, the layer count, and
    the head's (vocab x hidden) size, from the served model's config."""
    from transformers import AutoConfig

    from egrm.factory import judge_model_path

    cfg = AutoConfig.from_pretrained(judge_model_path(Settings()))
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    d, inner = cfg.hidden_size, cfg.intermediate_size
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
    shapes = [(qkv, d), (d, cfg.num_attention_heads * hd), (2 * inner, d), (d, inner)]
    return shapes, cfg.num_hidden_layers, cfg.vocab_size * d


def peak_flops(
    shapes: list[tuple[int, int]], dtype: torch.dtype, device: str = "cpu", rows: int = 256, repeats: int = 20
) -> float:
    """FLOP/s of torch.mm over the projections' shapes at `rows` tokens (a prefill-sized batch)."""
    weights = [torch.randn(i, o, dtype=dtype, device=device) for o, i in shapes]
    inputs = [torch.randn(rows, i, dtype=dtype, device=device) for _, i in shapes]
    sync = torch.cuda.synchronize if device != "cpu" else lambda: None
    flops = sum(2 * rows * o * i for o, i in shapes)
    for x, w in zip(inputs, weights, strict=True):  # warm-up
        torch.mm(x, w)
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for x, w in zip(inputs, weights, strict=True):
            torch.mm(x, w)
        sync()
        best = min(best, time.perf_counter() - start)
    return flops / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--requests", type=int, default=20, help="requests at concurrency 1 (3x that at 16)")
    parser.add_argument("--unloaded-rounds", type=int, default=3)
    args = parser.parse_args()

    settings = Settings()
    shapes, layers, head = model_shapes()
    flops_per_token = 2 * (layers * sum(o * i for o, i in shapes) + head)
    dtype = getattr(torch, resolve_dtype(settings.dtype, settings.device))
    if settings.threads:
        torch.set_num_threads(settings.threads)
    with running_server() as url:
        peak = peak_flops(shapes, dtype, settings.device)  # the server is idle now
        alone = asyncio.run(unloaded(url, args.unloaded_rounds))
        c1 = asyncio.run(closed_loop(url, 1, args.requests, 0))
        c16 = asyncio.run(closed_loop(url, 16, 3 * args.requests, args.requests))
    achieved = c16["computed_tokens_per_s"] * flops_per_token
    print(
        json.dumps(
            {
                "dtype": str(dtype).removeprefix("torch."),
                "long_share": 1 / LONG_EVERY,
                "unloaded": alone,
                "c1": c1,
                "c16": c16,
                "ratio_items_per_s_c16_vs_c1_mixed": round(c16["items_per_s"] / c1["items_per_s"], 2),
                "ratio_p90_c16_vs_unloaded_long": round(c16["p90_ms"] / alone["long_ms"], 2),
                "model_gflop_per_token": round(flops_per_token / 1e9, 3),
                "peak_mm_gflop_per_s": round(peak / 1e9, 1),
                "achieved_gflop_per_s_c16": round(achieved / 1e9, 1),
                "roofline_fraction": round(achieved / peak, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
