"""M parallel samples vs one, in one process, side by side: prints one JSON line.

Same prompt, same number of new tokens (16, EOS ignored) for every contender:
one sample; M=5 through our engine in batch layout ("parallel") and in one-sequence layout;
Hugging Face `generate(num_return_sequences=5)`; five sequential single samples (each also
timed as one sample). Rounds are interleaved (A B C D, A B C D, ...) so drift on a noisy
machine hits all alike; medians. Repeated at a ~2,000-token prefix. Ratios are what to read;
absolute times drift 10-20%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from egrm.config import Settings
from egrm.engines.base import BranchParams
from egrm.engines.embedded.engine import EmbeddedEngine
from egrm.engines.embedded.fetch import fetch_model
from egrm.engines.embedded.model_runner import Layout

M = 5
LADDER = [0.6, 0.7, 0.8, 0.9, 1.0]
PASSAGE = (
    "The history of astronomy spans from ancient observers who tracked the motion of the planets "
    "against the fixed stars to modern telescopes that image galaxies billions of light years away. "
)


def make_prompt(engine: EmbeddedEngine, target_tokens: int) -> list[int]:
    text = PASSAGE
    while engine.count_tokens(text) < target_tokens:
        text += PASSAGE
    ids = engine.encode_chat([{"role": "user", "content": text + "\nSummarise this."}])
    return ids


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_suite(engine: EmbeddedEngine, ids: list[int], new: int, rounds: int, warm_all: bool) -> dict[str, Any]:
    """warm_all: warm every contender up first; otherwise only our engine's single sample
    (a second suite runs on kernels the first one warmed; HF's warm-up at 2,000 tokens costs 30 s)."""
    loop = asyncio.new_event_loop()
    ladder = [
        BranchParams(temperature=t, top_p=0.95, max_new_tokens=new, ignore_eos=True, seed=i)
        for i, t in enumerate(LADDER)
    ]
    kv: dict[str, int] = {}

    def ours(layout: str, params: list[BranchParams], key: str | None = None) -> None:
        engine.layout = Layout(layout)
        out = loop.run_until_complete(engine.sample(ids, params))
        assert all(b.completion_tokens == new for b in out)
        if key:  # the KV the M branches hold (the prompt's blocks are shared, in either layout)
            kv[key] = engine.stats().kv_bytes

    model, pad = engine.core.model.model, min(engine.core.model.eos_ids)
    prompt = torch.tensor([ids])

    def hf_nrs() -> None:
        engine.run_on_model_thread(hf_generate)  # torch work stays on the model thread, as in serving

    def hf_generate() -> None:
        with torch.inference_mode():
            out = model.generate(
                prompt,
                do_sample=True,
                temperature=0.8,
                top_p=0.95,
                max_new_tokens=new,
                min_new_tokens=new,
                num_return_sequences=M,
                pad_token_id=pad,
            )
        assert out.shape == (M, len(ids) + new)

    times: dict[str, list[float]] = {"single": [], "parallel": [], "one_sequence": [], "hf_nrs": [], "sequential": []}

    def sequential() -> None:
        # Five single samples one after another: each is also a "single" measurement, so the
        # single sample needs no contender of its own (at 2,000 tokens that saves 6 s a round).
        calls = [timed(lambda p=p: ours("batch", [p])) for p in ladder]
        times["single"] += calls
        times["sequential"].append(sum(calls))

    contenders: dict[str, Callable[[], None]] = {
        "parallel": lambda: ours("batch", ladder),
        "one_sequence": lambda: ours("sequence", ladder, "kv_bytes_m5"),
        "hf_nrs": hf_nrs,
    }
    ours("batch", ladder[:1])  # warm-up: first-call allocations, page faults
    if warm_all:
        for fn in contenders.values():
            fn()
    for _ in range(rounds):
        sequential()
        for name, fn in contenders.items():
            times[name].append(timed(fn))
    loop.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "prefix_tokens": len(ids),
        "new_tokens": new,
        "rounds": rounds,
        **{f"median_ms_{k}": round(v * 1000, 1) for k, v in med.items()},
        "ratio_parallel_vs_single": round(med["parallel"] / med["single"], 3),
        "ratio_one_sequence_vs_single": round(med["one_sequence"] / med["single"], 3),
        "ratio_sequential_vs_parallel": round(med["sequential"] / med["parallel"], 3),
        "ratio_hf_nrs_vs_parallel": round(med["hf_nrs"] / med["parallel"], 3),
        "ratio_one_sequence_vs_parallel": round(med["one_sequence"] / med["parallel"], 3),
        **kv,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--model", type=Path, help="model folder (default: the fetched default)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"], help="as EGRM_DTYPE")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--long-rounds", type=int, default=1, help="rounds at 2,000 tokens (~75 s each on 2 cores); 0 skips them"
    )
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="as EGRM_DEVICE")
    args = parser.parse_args()

    # No prefix cache: every contender computes the same prompt from scratch (the fork is measured).
    path = str(args.model or fetch_model(Settings().cache_dir))
    engine = EmbeddedEngine.load(path, dtype=args.dtype, device=args.device, prefix_cache=False)
    threads = engine.run_on_model_thread(torch.get_num_threads)
    result: dict[str, Any] = {"m": M, "dtype": engine.dtype, "threads": threads, "forward": engine.forward}
    result["short"] = run_suite(engine, make_prompt(engine, 210), args.new_tokens, args.rounds, warm_all=True)
    if args.long_rounds > 0:
        result["long"] = run_suite(engine, make_prompt(engine, 1980), args.new_tokens, args.long_rounds, warm_all=False)
    asyncio.run(engine.close())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
