"""The API and the scorer worker as two real processes: long-path items scored remotely, and what
happens to them when the worker dies, comes back, or hangs."""

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from egrm.api import readiness
from loadtest.serverproc import free_port, running_server, scorer_process
from tests.live import metric

pytestmark = pytest.mark.slow

ITEMS = [
    {"prompt": "What is 12 + 30?", "response": "42"},
    {"prompt": "Capital of France?", "response": "Rome"},
    {"prompt": "Is water wet?", "response": "Yes"},
]
FALLBACKS = "egrm_scorer_fallback_total"
M = 3  # candidates per long-path item (a small M and short reasoning keep these tests quick)


@pytest.fixture(scope="module")
def worker_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def api(model_path, worker_port) -> Iterator[str]:
    env = {
        "EGRM_MODEL": str(model_path),
        "EGRM_SCORER_URL": f"http://127.0.0.1:{worker_port}",
        "EGRM_SCORER_TIMEOUT_S": "1",
        "EGRM_SCORER_RETRIES": "1",
        "EGRM_LONG_MAX_TOKENS": "16",
        # Every call reasons and scores anew: these tests are about the scorer, not the kept work.
        "EGRM_SHARE_QUESTIONS": "false",
        # One scorer call per item, all M candidates in it (no early stop): the counts below are those.
        "EGRM_LONG_ACCEPT": "0",
    }
    with running_server(env) as url:  # ready without any worker: a missing scorer only degrades
        yield url


def long_path(api: str, items: list[dict]) -> httpx.Response:
    return httpx.post(f"{api}/v1/rewards", json={"items": items, "options": {"path": "long", "m": M}}, timeout=300)


def assert_scored(response: httpx.Response, n: int) -> list[dict]:
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["index"] for r in results] == list(range(n))
    assert all(r["route"] == "long" and r["error"] is None and r["reward"] is not None for r in results)
    return results


def scorer_ready(api: str, expected: bool) -> bool:
    """What /readyz says of the scorer, once it says `expected` or after three background checks."""
    deadline = time.monotonic() + 3 * readiness.INTERVAL_S
    while True:
        r = httpx.get(f"{api}/readyz", timeout=10)
        assert r.status_code == 200 and r.json()["ready"] is True  # the engine alone decides readiness
        if r.json()["scorer"] is expected or time.monotonic() > deadline:
            return r.json()["scorer"]
        time.sleep(0.1)


def test_long_path_items_are_scored_by_the_worker(api, worker_port):
    with scorer_process(worker_port) as (worker, _):
        fallbacks = metric(api, FALLBACKS)
        results = assert_scored(long_path(api, ITEMS[:2]), 2)
        assert scorer_ready(api, True)
        assert metric(worker, "egrm_scorer_worker_candidates_total") == 2 * M
    for r in results:
        assert not r["degraded"]
        # The worker's scores weigh the candidates' vote: the judge's answer is the heaviest result.
        weight: dict[str, float] = {}
        for c in r["candidates"]:
            if c["answer"] is not None:
                weight[c["answer"]] = weight.get(c["answer"], 0.0) + max(c["score"], 0.0)
        assert r["judgements"][0]["judge_answer"] == (max(weight, key=weight.get) if weight else None)
        assert any(c["score"] > 0 for c in r["candidates"])
    assert metric(api, FALLBACKS) == fallbacks


def test_a_killed_worker_degrades_the_items_then_a_restarted_one_scores_again(api, worker_port):
    fallbacks = metric(api, FALLBACKS)
    with scorer_process(worker_port) as (_, proc), ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(long_path, api, ITEMS[:2])
        while metric(api, "egrm_requests_in_flight") == 0:
            assert not in_flight.done(), in_flight.result().text
        proc.send_signal(signal.SIGKILL)  # while the items are still reasoning
        proc.wait()
        results = assert_scored(in_flight.result(), 2)
    assert all(r["degraded"] and r["answer"] in ("Yes", "No") for r in results)
    assert all(c["score"] == 0.0 for r in results for c in r["candidates"])
    assert metric(api, FALLBACKS) == fallbacks + 2
    assert not scorer_ready(api, False)

    with scorer_process(worker_port) as (worker, _):
        (result,) = assert_scored(long_path(api, ITEMS[:1]), 1)
        assert scorer_ready(api, True)
        assert metric(worker, "egrm_scorer_worker_candidates_total") == M
    assert not result["degraded"]
    assert metric(api, FALLBACKS) == fallbacks + 2


def test_a_hung_worker_times_out_and_the_item_degrades(api, worker_port):
    fallbacks = metric(api, FALLBACKS)
    with scorer_process(worker_port) as (_, proc):
        proc.send_signal(signal.SIGSTOP)  # the kernel still accepts connections; nothing answers
        try:
            (result,) = assert_scored(long_path(api, ITEMS[:1]), 1)
            assert not scorer_ready(api, False)
        finally:
            proc.send_signal(signal.SIGCONT)
    assert result["degraded"] and result["answer"] in ("Yes", "No")
    assert metric(api, FALLBACKS) == fallbacks + 1
