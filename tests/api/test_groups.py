"""RLHF groups over real HTTP: one question judged once for every response, and a trainer's retry
finding its work after a deadline (OpenRLHF's client: one query per POST, 5 tries 1 s apart)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from egrm.config import Settings
from egrm.main import create_app
from loadtest.bench_grpo import group, per_query, quality
from tests.live import metric, serve

pytestmark = pytest.mark.slow


def outcomes(url: str) -> dict[str, float]:
    return {o: metric(url, f'egrm_shared_questions_total{{outcome="{o}"}}') for o in ("miss", "join", "hit")}


def test_a_group_posted_one_query_at_a_time_is_judged_once(engine):
    responses = group(0, 8)
    with serve(create_app(Settings(), engine=engine)) as url:
        rewards, tries = asyncio.run(per_query(url, responses))
        judged = quality(responses, rewards)  # no seed: the samples vary, not the one reward per answer
        assert tries == 8 and (judged["max_equal_answer_spread"], judged["lost"]) == (0.0, 0)
        assert outcomes(url) == {"miss": 1.0, "join": 7.0, "hit": 0.0}
        assert metric(url, "egrm_shared_questions_entries") == 1 and metric(url, "egrm_shared_questions_bytes") > 0
        # Later: the kept work answers, and says so.
        again = httpx.post(f"{url}/get_reward", json={"query": [responses[0].query], "prompts": [responses[0].prompt]})
        r = httpx.post(f"{url}/v1/rewards", json={"items": [{"prompt": "What is 11 * 3?", "response": "33"}]})
    assert again.status_code == 200 and again.json()["extra_logs"]["egrm_shared"] == [1.0]
    assert again.json()["rewards"] == [rewards[0]]
    assert r.status_code == 200 and r.json()["results"][0]["shared"] == "cached"  # the same question, read plainly


def test_past_the_deadline_the_work_goes_on_and_the_retry_gets_it(engine):
    body = {"items": [{"prompt": "What is 52 * 7?", "response": "364"}], "options": {"path": "long"}}
    with serve(create_app(Settings(request_timeout_s=0.3, share_grace_s=60), engine=engine)) as url:
        first = httpx.post(f"{url}/v1/rewards", json=body, timeout=30)
        answers = [first]
        while answers[-1].status_code == 504 and len(answers) < 60:
            answers.append(httpx.post(f"{url}/v1/rewards", json=body, timeout=30))
        work = outcomes(url)
    assert first.status_code == 504 and first.headers["retry-after"] == "1"
    assert "retry the same request" in first.json()["error"]["message"]
    last = answers[-1]
    assert last.status_code == 200 and last.json()["results"][0]["shared"] in ("joined", "cached")
    assert work["miss"] == 1  # every try waited for the one piece of work; none started over


def test_an_overload_past_the_deadline_loses_no_reward_to_openrlhf_retries(engine):
    """64 one-query POSTs (8 prompts x 8), a deadline well below what they need together: the
    first tries time out, their work goes on, and the retries collect it.

    The client's patience is 5 tries x (deadline + 1 s pause): no server can answer a client that
    has given up, and with no deadline at all nothing is retried. What the 8 questions need together
    depends on the machine and on the seedless routes (4 s to 14 s seen at fp32 on 2 cores), so the
    deadline is a third of what the same POSTs took here just before: first tries of the slowest
    questions meet it, and the patience (5/3 of that time, plus 5 s) outlasts their work."""
    responses = [r for i in range(8) for r in group(i, 8)]
    with serve(create_app(Settings(), engine=engine)) as url:
        start = time.perf_counter()
        asyncio.run(per_query(url, responses))
        needed = time.perf_counter() - start
    with serve(create_app(Settings(request_timeout_s=needed / 3), engine=engine)) as url:
        rewards, tries = asyncio.run(per_query(url, responses, tries=5))
        work = outcomes(url)
    assert quality(responses, rewards)["lost"] == 0 and all(0.0 <= r <= 1.0 for r in rewards)
    assert tries > len(responses), f"nothing met the {needed / 3:.1f} s deadline"  # first tries were retried
    assert work["miss"] == 8  # one piece of work per question, never restarted by a retry
