"""HttpScorer against a real worker process, and against loopback servers that hang or fail."""

import asyncio
import dataclasses
import signal

import pytest

from egrm.scorer.client import HttpScorer, ScorerError
from egrm.scorer.registry import load_scorer
from egrm.scorer.wire import MAX_ANSWER_CHARS
from loadtest.serverproc import free_port, scorer_process
from tests.live import metric
from tests.scorer.faults import failing_server, hanging_server
from tests.scorer.test_wiring import CANDIDATE

pytestmark = pytest.mark.slow

CANDIDATES = [CANDIDATE, dataclasses.replace(CANDIDATE, answer="No", agreement=0.2)]


async def scores_and_ready(url: str, **kw) -> tuple[list[float] | ScorerError, bool]:
    scorer = HttpScorer(url, **kw)
    try:
        try:
            result: list[float] | ScorerError = await scorer.score(CANDIDATES)
        except ScorerError as exc:
            result = exc
        return result, await scorer.ready()
    finally:
        await scorer.close()


def test_scores_from_the_worker_equal_the_in_process_ones():
    with scorer_process() as (url, _):
        scores, ready = asyncio.run(scores_and_ready(url))
    assert scores == asyncio.run(load_scorer(None).score(CANDIDATES)) and ready


def test_nobody_listening_raises_after_the_retries():
    error, ready = asyncio.run(scores_and_ready(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.01))
    assert isinstance(error, ScorerError) and "3 attempt(s)" in str(error) and "ConnectError" in str(error)
    assert not ready


def test_a_hanging_worker_times_out_on_every_attempt():
    with hanging_server() as (url, accepted):
        error, ready = asyncio.run(scores_and_ready(url, timeout_s=0.3, retries=1, backoff_s=0.01))
    assert isinstance(error, ScorerError) and "2 attempt(s)" in str(error)
    assert not ready
    assert accepted.value == 3  # two score attempts (no more: the retry is bounded) and one readiness probe


def test_a_5xx_is_retried_then_raised():
    with failing_server(503) as (url, received):
        error, _ = asyncio.run(scores_and_ready(url, retries=2, backoff_s=0.01))
    assert isinstance(error, ScorerError) and "HTTP 503" in str(error)
    assert received.value == 3


def test_a_refusal_is_not_retried():
    too_long = dataclasses.replace(CANDIDATE, answer="x" * (MAX_ANSWER_CHARS + 1))

    async def refused(url: str) -> ScorerError:
        scorer = HttpScorer(url, retries=3)
        try:
            with pytest.raises(ScorerError, match="HTTP 422") as caught:
                await scorer.score([too_long])
            return caught.value
        finally:
            await scorer.close()

    with scorer_process() as (url, _):
        error = asyncio.run(refused(url))
        assert metric(url, 'egrm_scorer_worker_requests_total{status="422"}') == 1
    assert "candidates[0].answer" in str(error)


def test_one_client_survives_a_worker_restart_on_the_same_port():
    """The pooled keep-alive connection dies with the worker; the next call reconnects."""
    port = free_port()

    async def across_restart() -> tuple[list[float], list[float]]:
        scorer = HttpScorer(f"http://127.0.0.1:{port}", backoff_s=0.05)
        try:
            with scorer_process(port) as (_, proc):
                first = await scorer.score(CANDIDATES)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            with scorer_process(port):
                second = await scorer.score(CANDIDATES)
            return first, second
        finally:
            await scorer.close()

    first, second = asyncio.run(across_restart())
    assert first == second == asyncio.run(load_scorer(None).score(CANDIDATES))
