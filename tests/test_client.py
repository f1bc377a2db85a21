"""egrm.client against real servers: the real model over HTTP, and a tiny scripted HTTP server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from egrm.client import (
    AsyncEgrmClient,
    EgrmAPIError,
    EgrmClient,
    EgrmConnectionError,
    EgrmTimeoutError,
    RetryPolicy,
)
from egrm.config import Settings
from egrm.main import create_app
from egrm.protocol import RewardItem, RewardResponse, RewardResult, TimingsOut, Usage
from loadtest.serverproc import free_port
from tests.live import serve

ITEMS = [{"prompt": f"What is {i}+{i}?", "response": str(2 * i), "id": f"q{i}"} for i in range(5)]
FAST = RetryPolicy(backoff_s=0.01, max_wait_s=0.05)


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    # At most 2 items per request: a client that did not split 5 items would get 413.
    with serve(create_app(Settings(max_items=2), engine=engine)) as base:
        yield base


@pytest.mark.slow
def test_sync_client_splits_and_keeps_order(url):
    with EgrmClient(url, batch_size=2, concurrency=2) as client:
        assert client.ready()
        results = client.score(ITEMS, {"path": "short", "seed": 1})
    assert [r.index for r in results] == [0, 1, 2, 3, 4]
    assert [r.id for r in results] == [item["id"] for item in ITEMS]
    assert all(r.route == "short" and 0.0 <= r.reward <= 1.0 and sum(r.votes.values()) == 5 for r in results)
    # On the short path the reward is the share of the five samples that agree with the response.
    assert all(round(r.reward * 5, 6).is_integer() for r in results)


@pytest.mark.slow
def test_async_client_splits_and_keeps_order(url):
    async def run() -> list[RewardResult]:
        async with AsyncEgrmClient(url, batch_size=2, concurrency=3) as client:
            assert await client.ready()
            return await client.score([RewardItem(**i) for i in ITEMS], {"path": "short"})

    results = asyncio.run(run())
    assert [(r.index, r.id) for r in results] == [(i, f"q{i}") for i in range(5)]


@pytest.mark.slow
def test_a_refusal_raises_with_the_servers_message(url):
    with EgrmClient(url, batch_size=2) as client:
        with pytest.raises(EgrmAPIError) as err:
            client.score([*ITEMS[:2], {"prompt": "x"}], {"path": "short"})
    assert err.value.status == 422 and err.value.param == "items[0].response" and err.value.batch_start == 2
    assert "Field required" in err.value.message and "item 2" in str(err.value)
    with EgrmClient(url, batch_size=5) as client, pytest.raises(EgrmAPIError) as err:
        client.score(ITEMS)  # batch bigger than the server allows: 413 is not retried
    assert err.value.status == 413 and err.value.param == "items"


@pytest.mark.slow
def test_a_504_whose_work_goes_on_is_retried_until_it_is_done(engine):
    """Past the deadline the server keeps the question's work and says Retry-After: the client's
    retry collects it (a 504 without Retry-After, sharing off, is not retried)."""
    item = {"prompt": "What is 47 * 6?", "response": "282"}
    with serve(create_app(Settings(request_timeout_s=0.3), engine=engine)) as base:
        with EgrmClient(base, retry=RetryPolicy(max_retries=20)) as client:
            (result,) = client.score([item], {"path": "long"})
    assert result.route == "long" and result.shared in ("joined", "cached")
    with serve(create_app(Settings(request_timeout_s=0.3, share_questions=False), engine=engine)) as base:
        with EgrmClient(base, retry=FAST) as client, pytest.raises(EgrmAPIError) as err:
            client.score([item], {"path": "long"})
    assert err.value.status == 504


@pytest.mark.slow
def test_a_real_429_from_a_full_engine_queue_is_retried(loaded_fp32, caplog):
    from egrm.engines.embedded.engine import EmbeddedEngine
    from tests.engines.test_batching import hold_model_thread

    engine = EmbeddedEngine(loaded_fp32, max_queue=1)
    try:
        with serve(create_app(Settings(), engine=engine)) as base:
            release = hold_model_thread(engine)
            queued = engine.call(lambda: None)  # the one queue slot is taken: the next job gets 429
            outcome: dict[str, object] = {}

            def call() -> None:
                with EgrmClient(base, retry=RetryPolicy(max_retries=50, max_wait_s=0.2)) as client:
                    outcome["results"] = client.score(ITEMS[:1], {"path": "short"})

            caplog.set_level(logging.WARNING, logger="egrm.client")
            worker = threading.Thread(target=call)
            worker.start()
            while "egrm answered 429" not in caplog.text:  # the server refused at least once
                assert worker.is_alive(), outcome
                time.sleep(0.05)
            release.set()
            queued.result(timeout=10)
            worker.join(timeout=60)
        (result,) = outcome["results"]  # type: ignore[misc]
        assert result.error is None and result.route == "short"
    finally:
        asyncio.run(engine.close())


class Scripted:
    """A real HTTP server that answers /v1/rewards with the given statuses, then 200."""

    def __init__(self, statuses: list[int], retry_after: str | None = "0", delay_s: float = 0.0):
        self.statuses, self.seen = list(statuses), 0
        app = FastAPI()

        @app.post("/v1/rewards")
        async def rewards(request: Request) -> JSONResponse:
            self.seen += 1
            body = await request.json()
            await asyncio.sleep(delay_s)
            if self.statuses:
                status = self.statuses.pop(0)
                headers = {"Retry-After": retry_after} if retry_after else {}
                error = {"type": "rate_limit_error", "message": f"scripted {status}", "param": None}
                return JSONResponse({"error": error}, status_code=status, headers=headers)
            return JSONResponse(_answer(len(body["items"])).model_dump())

        self.app = app


def _answer(n: int) -> RewardResponse:
    timings = TimingsOut(sample_ms=1, reasoning_ms=0, scorer_ms=0, total_ms=1)
    results = [
        RewardResult(index=i, reward=1.0, answer="Yes", route="short", consensus=1.0, votes={"Yes": 5}, timings=timings)
        for i in range(n)
    ]
    return RewardResponse(model="scripted", results=results, usage=Usage())


@pytest.mark.parametrize("status", [429, 503])
def test_retries_then_succeeds(status):
    scripted = Scripted([status, status])
    with serve(scripted.app) as base, EgrmClient(base, retry=FAST) as client:
        results = client.score(ITEMS[:3])
    assert scripted.seen == 3 and [r.index for r in results] == [0, 1, 2]


def test_async_retries_then_succeeds():
    scripted = Scripted([429, 503, 429], retry_after=None)  # no Retry-After: the client's own backoff

    async def run() -> list[RewardResult]:
        async with AsyncEgrmClient(base, retry=FAST) as client:
            return await client.score(ITEMS[:2])

    with serve(scripted.app) as base:
        results = asyncio.run(run())
    assert scripted.seen == 4 and len(results) == 2


def test_retries_are_bounded():
    scripted = Scripted([503] * 10)
    with serve(scripted.app) as base, EgrmClient(base, retry=RetryPolicy(max_retries=2, max_wait_s=0.01)) as client:
        with pytest.raises(EgrmAPIError) as err:
            client.score(ITEMS[:1])
    assert err.value.status == 503 and scripted.seen == 3


def test_other_errors_are_not_retried():
    scripted = Scripted([400])
    with serve(scripted.app) as base, EgrmClient(base, retry=FAST) as client:
        with pytest.raises(EgrmAPIError) as err:
            client.score(ITEMS[:1])
    assert err.value.status == 400 and err.value.message == "scripted 400" and scripted.seen == 1


def test_timeout_and_connection_errors():
    scripted = Scripted([], delay_s=5)
    with serve(scripted.app) as base, EgrmClient(base, timeout_s=0.3) as client:
        with pytest.raises(EgrmTimeoutError):
            client.score(ITEMS[:1])
    nobody = f"http://127.0.0.1:{free_port()}"
    with EgrmClient(nobody, retry=RetryPolicy(connect_retries=1)) as client:
        assert client.ready() is False
        with pytest.raises(EgrmConnectionError, match="cannot reach"):
            client.score(ITEMS[:1])


def test_wait_honours_retry_after_and_caps_it():
    policy = RetryPolicy(backoff_s=0.5, max_wait_s=30)
    assert policy.wait_s(0, "2") == 2.0
    assert policy.wait_s(0, "3600") == 30.0  # capped
    assert policy.wait_s(3, None) == 4.0  # 0.5 * 2**3
    assert policy.wait_s(10, None) == 30.0
    assert policy.wait_s(0, "Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: no wait
    assert policy.wait_s(1, "soon") == 1.0  # unreadable: the client's own backoff


def test_bad_batching_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        EgrmClient(batch_size=0)
