"""The long path's early stop over vLLM, under load: what vLLM's request priority adds. Prints one
JSON line.

Early stop reasons from the first candidate and sends the others at once as spare work, dropped
when the first one's score decides. The embedded engine runs spare work only in rows a step has to
spare; egrm sends vLLM its rank as the request's `priority`, which vLLM heeds when started with
`--scheduling-policy priority`: spare calls start only when no live call waits for a slot, so
under load the dropped ones mostly never run. Under fcfs they run beside live work, and early stop
saves little there.

For each scheduling policy (fcfs, then priority) a vLLM serves the judge with `--max-num-seqs
SLOTS` (a server under load: calls wait for slots), and `egrm eval`'s load run (egrm/evals/load.py:
`clients` clients send GRPO-shaped groups of held-out arith-mixed questions, sharing on) runs two
policies over it through egrm's OpenAI engine: always long (every candidate to the end, the
baseline) and early stop. Reported per scheduling: items/s, accuracy, the completion tokens vLLM
generated per item (from its /metrics: aborted spare work included, which egrm's usage does not
count) and early stop's ratios to always long; then early stop's items/s with priority over fcfs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from egrm.config import Settings
from egrm.engines.embedded.loader import resolve_dtype
from egrm.evals.data import load_dataset
from egrm.evals.harness import EvalConfig
from egrm.evals.load import groups, run_policy
from egrm.factory import judge_model_path, pipeline_from
from loadtest.serverproc import free_port, vllm_counters, vllm_server

SERVED = "judge"
POLICIES = {"always_long": "long", "early_stop": "early"}
GENERATED = "vllm:generation_tokens_total"


def generated(url: str) -> float:
    """Completion tokens vLLM has generated."""
    return vllm_counters(url, GENERATED).get(GENERATED, 0.0)


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(engine="openai", openai_url=f"{url}/v1", openai_dialect="vllm", openai_model=SERVED)
    items = load_dataset("builtin:arith-mixed", "test")[: args.questions]
    config = EvalConfig(seed=args.seed)
    batch = groups(items, args.group, config.seed)
    runs: dict[str, Any] = {}
    async with pipeline_from(settings) as pipeline:
        for name, mode in POLICIES.items():
            before = generated(url)
            run = await run_policy(pipeline, batch, config, mode, args.clients)
            tokens = generated(url) - before
            runs[name] = run | {"vllm_generated_tokens_per_item": round(tokens / (len(batch) * args.group), 1)}
    base, early = runs["always_long"], runs["early_stop"]
    tokens = "vllm_generated_tokens_per_item"
    runs["early_stop_vs_always_long"] = {
        "items_per_s": round(early["items_per_s"] / base["items_per_s"], 3),
        "vllm_generated_tokens": round(early[tokens] / base[tokens], 3),
    }
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--questions", type=int, default=32, help="held-out questions, one group each")
    parser.add_argument("--group", type=int, default=4, help="responses per question (one request)")
    parser.add_argument("--slots", type=int, default=16, help="vLLM's --max-num-seqs")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--dtype", default="auto", help="vLLM's dtype")
    args = parser.parse_args()
    settings = Settings()
    out: dict[str, Any] = {"dtype": resolve_dtype(args.dtype), "clients": args.clients, "slots": args.slots}
    for policy in ("fcfs", "priority"):
        port = free_port()
        flags = ["--max-num-seqs", str(args.slots)]
        with vllm_server(
            judge_model_path(settings),
            settings.cache_dir,
            port,
            SERVED,
            out["dtype"],
            eager=True,
            args=flags,
            scheduling=policy,
        ):
            out[policy] = asyncio.run(measure(f"http://127.0.0.1:{port}", args))
    out["early_stop_items_per_s_priority_vs_fcfs"] = round(
        out["priority"]["early_stop"]["items_per_s"] / out["fcfs"]["early_stop"]["items_per_s"], 3
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
