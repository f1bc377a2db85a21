"""How far batch composition moves a reward with the same seed: one JSON line.

"One reward per answer" across replicas rests on two things: the work stored in Redis is the one
every replica judges against, and a question without a seed is seeded from its key, so a replica
that computes it again (Redis gone, the window expired) draws the same samples. The same samples,
not the same floats: an engine step computes a question beside whatever else runs, and a kernel's
sums change order with the batch's shape (bf16 above all). This measures by how much.

For each dtype, a fresh `egrm serve` (question sharing off: every item computes its own work)
judges N items with one seed, first one request per item, one at a time (a batch of one), then
all N items in one request (a batch of N, their questions decoded together). Reports per dtype the
largest reward difference between the two, how many rewards differ at all (and past 1e-6, 1e-4,
1e-2), and how many items changed route, vote or a sampled answer.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx

from loadtest.bench_grpo import group
from loadtest.serverproc import running_server


def items(n: int) -> list[dict[str, str]]:
    """n questions (bench_grpo's), each with a right or a near-miss response."""
    return [{"prompt": r.prompt, "response": r.text} for i in range(n) for r in group(i, 2)[i % 2 : i % 2 + 1]]


def judged(url: str, batch: list[dict[str, str]], seed: int) -> list[dict[str, Any]]:
    body = {"items": batch, "options": {"seed": seed, "return_samples": True}}
    r = httpx.post(f"{url}/v1/rewards", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["results"]


def compare(alone: list[dict[str, Any]], together: list[dict[str, Any]]) -> dict[str, Any]:
    diffs = [abs(a["reward"] - b["reward"]) for a, b in zip(alone, together, strict=True)]
    changed = {
        what: sum(pick(a) != pick(b) for a, b in zip(alone, together, strict=True))
        for what, pick in (
            ("route", lambda r: r["route"]),
            ("votes", lambda r: r["votes"]),
            ("samples", lambda r: [s["text"] for s in r["samples"]]),
        )
    }
    return {
        "max_reward_diff": max(diffs),
        "rewards_differing": sum(d > 0 for d in diffs),
        **{f"rewards_differing_past_{t:g}": sum(d > t for d in diffs) for t in (1e-6, 1e-4, 1e-2)},
        **{f"items_changed_{what}": n for what, n in changed.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    args = parser.parse_args()
    batch = items(args.items)
    out: dict[str, Any] = {"items": len(batch), "seed": args.seed}
    for dtype in args.dtypes.split(","):
        with running_server({"EGRM_DTYPE": dtype, "EGRM_SHARE_QUESTIONS": "false"}) as url:
            alone = [judged(url, [item], args.seed)[0] for item in batch]
            together = judged(url, batch, args.seed)
        out[dtype] = compare(alone, together)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
