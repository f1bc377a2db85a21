"""The workload RLHF sends: N prompts x G responses, judged with the question shared and not, in one run.

GRPO-style trainers sample G responses per prompt and send them to the reward service at once:
OpenRLHF one query per POST (`openrlhf/utils/agent.py`, `_fetch_rewards_via_http`), veRL's per-item
managers one call per response, veRL's batch shape one request per group. Reference-free, half of
each group right, answers written several ways, prompts in a Qwen2.5 chat template as OpenRLHF
decodes them, no seed.

Each setting runs on a fresh `egrm serve` (EGRM_SHARE_QUESTIONS=true, then false), one server at a
time, and sends both shapes. Prints one JSON line: per setting and shape, items/s, the largest
reward spread among equal answers to one question, and accuracy against the truth (reward >= 0.5
is "right"); then the ratios of sharing on to off.

--overload instead sends 8 prompts x 8 one-query POSTs to a server whose EGRM_REQUEST_TIMEOUT_S is
well below the time they need together, each retried as OpenRLHF retries (5 tries, 1 s apart, any
error), and counts the rewards lost, sharing on and off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from loadtest.serverproc import running_server

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
FORMS = [
    "{v}",
    "The answer is {v}.",
    "$\\boxed{{{v}}}$",
    "{q} = {v}",
    "**{v}**",
    "I think it is {v}.",
    "{v}.",
    "Answer: {v}",
]
TRIES, PAUSE_S, CLIENT_TIMEOUT_S = 5, 1.0, 180.0  # OpenRLHF's retry policy


@dataclass(frozen=True, slots=True)
class Response:
    question: int
    prompt: str  # as the trainer decodes it: the chat template applied
    text: str
    value: int  # the number it answers
    right: bool

    @property
    def query(self) -> str:
        return self.prompt + self.text + "<|im_end|>"


def group(i: int, size: int) -> list[Response]:
    """Prompt i and its G responses: even ones right, odd ones near misses, each in another form."""
    a, b = 11 + (17 * i) % 80, 3 + (7 * i) % 9
    q, value = (f"{a} + {b}", a + b) if i % 2 else (f"{a} * {b}", a * b)
    user = f"<|im_start|>user\nWhat is {q}?<|im_end|>\n"
    prompt = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n{user}<|im_start|>assistant\n"
    out = []
    for k in range(size):
        given = value if k % 2 == 0 else value + (1, -1, 10, -10)[(k // 2) % 4]
        out.append(Response(i, prompt, FORMS[k % len(FORMS)].format(v=given, q=q), given, given == value))
    return out


def quality(responses: list[Response], rewards: list[float | None]) -> dict[str, Any]:
    """The largest reward spread among equal answers to one question; accuracy, with its standard
    error over questions (sharing judges a question's responses together: their errors go together,
    so the questions, not the responses, are the independent draws)."""
    by_answer: dict[tuple[int, int], list[float]] = {}
    by_question: dict[int, list[bool]] = {}
    for r, reward in zip(responses, rewards, strict=True):
        if reward is not None:
            by_answer.setdefault((r.question, r.value), []).append(reward)
            by_question.setdefault(r.question, []).append((reward >= 0.5) == r.right)
    per_question = [sum(v) / len(v) for v in by_question.values()]
    scored = sum(len(v) for v in by_question.values())
    spread = max((max(v) - min(v) for v in by_answer.values()), default=0.0)
    se = statistics.stdev(per_question) / len(per_question) ** 0.5 if len(per_question) > 1 else 0.0
    return {
        "max_equal_answer_spread": round(spread, 3),
        "accuracy": round(sum(sum(v) for v in by_question.values()) / max(1, scored), 3),
        "accuracy_se": round(se, 3),
        "lost": len(responses) - scored,
    }


async def per_query(url: str, responses: list[Response], tries: int = 1) -> tuple[list[float | None], int]:
    """One POST per query, all at once, to /get_reward; each tried up to `tries` times, PAUSE_S
    apart, as OpenRLHF does. Returns the rewards (None: lost) and the tries spent."""
    spent = 0
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    async def one(client: httpx.AsyncClient, r: Response) -> float | None:
        nonlocal spent
        body = {"query": [r.query], "prompts": [r.prompt], "labels": [None]}
        for attempt in range(tries):
            spent += 1
            try:
                answer = await client.post(f"{url}/get_reward", json=body, timeout=CLIENT_TIMEOUT_S)
                if answer.status_code == 200:
                    return float(answer.json()["rewards"][0])
            except httpx.HTTPError:
                pass
            if attempt + 1 < tries:
                await asyncio.sleep(PAUSE_S)
        return None

    async with httpx.AsyncClient(limits=limits) as client:
        rewards = await asyncio.gather(*(one(client, r) for r in responses))
    return list(rewards), spent


async def per_group(url: str, groups: list[list[Response]]) -> list[float | None]:
    """One /v1/rewards request per group, all groups at once (veRL's batch shape)."""

    async def one(client: httpx.AsyncClient, responses: list[Response]) -> list[float | None]:
        items = [{"prompt": r.prompt, "response": r.text} for r in responses]
        answer = await client.post(f"{url}/v1/rewards", json={"items": items}, timeout=CLIENT_TIMEOUT_S)
        answer.raise_for_status()
        return [x["reward"] for x in answer.json()["results"]]

    async with httpx.AsyncClient() as client:
        done = await asyncio.gather(*(one(client, g) for g in groups))
    return [x for rewards in done for x in rewards]


def timed(responses: list[Response], send: Callable[[], list[float | None]]) -> dict[str, Any]:
    start = time.perf_counter()
    rewards = send()
    wall = time.perf_counter() - start
    return {"items_per_s": round(len(responses) / wall, 2), "wall_s": round(wall, 1), **quality(responses, rewards)}


def throughput(prompts: int, size: int) -> dict[str, Any]:
    # Each shape its own questions: the second must not read what the first left in the window.
    per_query_groups = [group(i, size) for i in range(prompts)]
    per_group_groups = [group(prompts + i, size) for i in range(prompts)]
    queries = [r for g in per_query_groups for r in g]
    runs: dict[str, dict[str, Any]] = {}
    for name, share in (("sharing_off", "false"), ("sharing_on", "true")):
        with running_server({"EGRM_SHARE_QUESTIONS": share}) as url:
            runs[name] = {
                "per_query": timed(queries, lambda: asyncio.run(per_query(url, queries))[0]),
                "per_group": timed(
                    [r for g in per_group_groups for r in g], lambda: asyncio.run(per_group(url, per_group_groups))
                ),
            }
    on, off = runs["sharing_on"], runs["sharing_off"]
    out: dict[str, Any] = {"prompts": prompts, "group_size": size, **runs}
    for shape in ("per_query", "per_group"):
        out[f"ratio_items_per_s_on_vs_off_{shape}"] = round(on[shape]["items_per_s"] / off[shape]["items_per_s"], 2)
        out[f"accuracy_on_minus_off_{shape}"] = round(on[shape]["accuracy"] - off[shape]["accuracy"], 3)
    return out


def overload(timeout_s: float) -> dict[str, Any]:
    flat = [r for i in range(8) for r in group(i, 8)]
    runs: dict[str, Any] = {"queries": len(flat), "request_timeout_s": timeout_s, "tries": TRIES}
    for name, share in (("sharing_off", "false"), ("sharing_on", "true")):
        env = {"EGRM_SHARE_QUESTIONS": share, "EGRM_REQUEST_TIMEOUT_S": str(timeout_s)}
        with running_server(env) as url:
            start = time.perf_counter()
            rewards, spent = asyncio.run(per_query(url, flat, TRIES))
            runs[name] = {"wall_s": round(time.perf_counter() - start, 1), "tries": spent, **quality(flat, rewards)}
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--prompts", type=int, default=16, help="N prompts")
    parser.add_argument("--group", type=int, default=8, help="G responses per prompt")
    parser.add_argument("--overload", action="store_true", help="64 retried one-query POSTs past a short deadline")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="EGRM_REQUEST_TIMEOUT_S under --overload")
    args = parser.parse_args()
    result = overload(args.timeout_s) if args.overload else throughput(args.prompts, args.group)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
