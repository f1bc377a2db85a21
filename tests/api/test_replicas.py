"""Two `egrm serve` replicas and a real redis-server, over real HTTP: a GRPO group split between the
replicas is judged once with one reward per answer; Redis gone mid-run loses no reward; the replica
that computes a question killed mid-question loses none either (the other takes it over).

The tests run in this order on one cluster: the last kills a replica.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import httpx
import pytest

from loadtest.serverproc import free_port, redis_server, server_process
from tests.live import metric, wait_for

pytestmark = pytest.mark.slow


@dataclass
class Cluster:
    redis_port: int
    redis: subprocess.Popen
    replicas: list[tuple[str, subprocess.Popen]]  # (base URL, process)
    stack: ExitStack

    @property
    def urls(self) -> list[str]:
        return [url for url, _ in self.replicas]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    port = free_port()
    # One torch thread each: two processes of two threads on two cores slow each other down ~40x.
    env = {"EGRM_THREADS": "1", "EGRM_SHARE_URL": f"redis://127.0.0.1:{port}/0", "EGRM_SHARE_LEASE_S": "2"}
    with ExitStack() as stack:
        _, redis = stack.enter_context(redis_server(port))
        replicas = [stack.enter_context(server_process(env)) for _ in range(2)]
        yield Cluster(port, redis, replicas, stack)


def store_total(url: str, outcome: str) -> float:
    return metric(url, f'egrm_shared_store_total{{outcome="{outcome}"}}')


def group(prompt: str, responses: list[str]) -> list[dict]:
    """OpenRLHF's remote_rm_fn bodies, one query each (a ChatML policy's decoded rollouts)."""
    head = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    return [{"query": [head + r + "<|im_end|>"], "prompts": [head]} for r in responses]


async def post_with_retries(urls: list[str], body: dict, first: int) -> dict:
    """As OpenRLHF's client: a failed POST is retried (the Service sends it to a live replica)."""
    async with httpx.AsyncClient(timeout=180) as client:
        for attempt in range(5):
            try:
                r = await client.post(f"{urls[(first + attempt) % len(urls)]}/get_reward", json=body)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1)
    raise AssertionError(f"no reward after 5 tries: {body}")


RESPONSES = ["42", "The answer is 42.", "41", "**41**"]


def test_a_group_split_between_replicas_is_judged_once_with_one_reward_per_answer(cluster):
    prompts = [f"What is {a} + {b}?" for a, b in ((23, 19), (30, 12), (17, 25), (40, 2))]
    bodies = [body for p in prompts for body in group(p, RESPONSES)]

    async def main():
        return await asyncio.gather(*(post_with_retries(cluster.urls, b, i) for i, b in enumerate(bodies)))

    before = {o: sum(store_total(u, o) for u in cluster.urls) for o in ("computed", "local", "wait", "hit")}
    answers = asyncio.run(main())
    after = {o: sum(store_total(u, o) for u in cluster.urls) for o in before}
    assert after["computed"] - before["computed"] == len(prompts)  # not 2 x: each question once
    assert after["local"] == before["local"]
    # Each replica saw every question (alternating POSTs): the other's work was awaited or read.
    assert after["wait"] + after["hit"] - before["wait"] - before["hit"] == len(prompts)
    rewards = [a["rewards"][0] for a in answers]
    for p in range(len(prompts)):
        right, right_again, wrong, wrong_again = rewards[4 * p : 4 * p + 4]
        assert right == right_again and wrong == wrong_again  # one reward per answer, across replicas
        assert right > wrong


def test_redis_gone_mid_run_loses_no_reward_and_readiness_says_so(cluster):
    bodies = [b for p in ("What is 12 * 3?", "What is 99 - 45?") for b in group(p, RESPONSES[:2])]

    async def run():
        calls = [asyncio.ensure_future(post_with_retries(cluster.urls, b, i)) for i, b in enumerate(bodies)]
        await asyncio.sleep(0.2)
        cluster.redis.kill()
        cluster.redis.wait()
        return await asyncio.gather(*calls)

    answers = asyncio.run(run())
    assert all(len(a["rewards"]) == 1 for a in answers)  # every reward came back
    assert sum(metric(url, "egrm_shared_store_errors_total") for url in cluster.urls) >= 1
    # Both replicas still serve; the readiness monitor's check finds Redis gone on each.
    assert wait_for(lambda: all(readyz(u)["store"].startswith("redis: degraded") for u in cluster.urls), 10)
    assert all(readyz(u)["ready"] for u in cluster.urls)
    # Redis back (empty, on the same port): the replicas use it again once their retry_s is over.
    _, cluster.redis = cluster.stack.enter_context(redis_server(cluster.redis_port))
    assert wait_for(lambda: all(readyz(u)["store"] == "redis" for u in cluster.urls), 30)


def test_the_replica_computing_a_question_killed_mid_question_loses_no_reward(cluster):
    (url_a, proc_a), (url_b, _) = cluster.replicas
    body = {
        "items": [{"prompt": "What is 387 * 29?", "response": "11223"}],
        "options": {"path": "long", "m": 5},
    }
    computed_before = store_total(url_a, "computed")
    takeovers_before = store_total(url_b, "takeover")

    async def run():
        async with httpx.AsyncClient(timeout=180) as client:
            on_a = asyncio.ensure_future(client.post(f"{url_a}/v1/rewards", json=body))
            while store_total(url_a, "computed") == computed_before:  # a holds the question's lock
                await asyncio.sleep(0.05)
            on_b = asyncio.ensure_future(client.post(f"{url_b}/v1/rewards", json=body))
            await asyncio.sleep(0.5)  # b waits for a's work
            proc_a.kill()
            with pytest.raises(httpx.HTTPError):
                await on_a
            # a's client retries where the Service sends it now: b.
            retried = asyncio.ensure_future(client.post(f"{url_b}/v1/rewards", json=body))
            return await on_b, await retried

    from_b, retried = asyncio.run(run())
    assert from_b.status_code == 200 and retried.status_code == 200
    assert store_total(url_b, "takeover") == takeovers_before + 1  # b computed it once the lease lapsed
    (first,), (second,) = from_b.json()["results"], retried.json()["results"]
    assert first["reward"] == second["reward"] and first["route"] == "long"


def readyz(url: str) -> dict:
    return httpx.get(f"{url}/readyz", timeout=5).json()
