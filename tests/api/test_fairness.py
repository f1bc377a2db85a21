"""One client must not shut the others out, over real HTTP on the real model: work nobody waits
for (a deadline passed, its grace runs) yields to live work and is not counted at admission, and
one request's backlog never has another refused."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from egrm.config import Settings
from egrm.main import create_app
from tests.live import metric, serve, wait_for

pytestmark = pytest.mark.slow


def polite(i: int) -> dict:
    """A one-item short-path request on a question of its own (nothing read from the window)."""
    item = {"prompt": f"What is {20 + i} + {31 + 2 * i}?", "response": str(51 + 3 * i)}
    return {"items": [item], "options": {"path": "short"}}


def backlog(questions: int) -> dict:
    """A big request: long prompts of questions of their own, each reasoned on by 8 branches."""
    items = [{"prompt": f"Add up: {'7' * 600} ({i})", "response": str(i)} for i in range(questions)]
    return {"items": items, "options": {"path": "long", "m": 8}}


HOSTILE = backlog(24)


def polite_seconds(engine) -> float:
    """What a polite request takes here, alone (the deadlines below are made of it: the machines
    differ several-fold)."""
    with serve(create_app(Settings(), engine=engine)) as url:
        times = []
        for i in range(3):
            start = time.perf_counter()
            assert httpx.post(f"{url}/v1/rewards", json=polite(900 + i), timeout=60).status_code == 200
            times.append(time.perf_counter() - start)
    return max(times[1:])


def test_work_in_its_grace_yields_to_polite_requests_and_never_has_them_refused(engine):
    deadline = 3 * polite_seconds(engine)
    settings = Settings(request_timeout_s=deadline, share_grace_s=8 * deadline)
    with serve(create_app(settings, engine=engine)) as url:
        hostile = httpx.post(f"{url}/v1/rewards", json=HOSTILE, timeout=120)  # no rate known yet: admitted
        assert hostile.status_code == 504, hostile.text
        orphaned = metric(url, "egrm_shared_questions_orphaned")
        background = metric(url, "egrm_engine_background_steps_total")
        # Polite requests one after another: the first few give admission its rate, after which
        # the orphaned questions would have had every one refused had they counted (24 questions
        # at about 1 per polite request's time: 24 deadlines' worth, more than deadline + grace).
        statuses = [httpx.post(f"{url}/v1/rewards", json=polite(i), timeout=120).status_code for i in range(8)]
        assert statuses == [200] * 8 and metric(url, "egrm_shared_questions_refused_total") == 0
        # Between the polite requests, and after them, the orphaned work runs in the idle time.
        assert wait_for(lambda: metric(url, "egrm_engine_background_steps_total") > background, 30)
    assert orphaned == len(HOSTILE["items"])  # the hostile request's questions, nobody waiting


def test_a_big_requests_backlog_does_not_have_small_ones_beside_it_refused(engine):
    """On a fresh server the big request is admitted whole (no rate known yet). Polite requests
    sent while it runs give admission its rate; they are then judged on their own work at their
    share of the engine, not queued behind the big one's 72 questions (which, counted, would take
    more than the deadline plus the grace). The big one runs to its deadline: 20 polite requests'
    time alone, room for about 8 beside it (each takes 2-3 times as long there); with 12 and 24
    questions it sometimes finished first, after 5."""
    deadline = 20 * polite_seconds(engine)
    settings = Settings(request_timeout_s=deadline, share_grace_s=0)
    statuses = []
    with serve(create_app(settings, engine=engine)) as url, ThreadPoolExecutor(1) as pool:
        big = pool.submit(httpx.post, f"{url}/v1/rewards", json=backlog(72), timeout=300)
        assert wait_for(lambda: metric(url, "egrm_shared_questions_running") > 0, 30)
        while not big.done():
            statuses.append(httpx.post(f"{url}/v1/rewards", json=polite(100 + len(statuses)), timeout=120).status_code)
        refused = metric(url, "egrm_shared_questions_refused_total")
    assert len(statuses) > 5  # enough for admission to know the rate, and to use it
    assert statuses == [200] * len(statuses) and refused == 0
