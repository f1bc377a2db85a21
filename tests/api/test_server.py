"""`egrm serve` as a real process on a loopback port, spoken to over real HTTP."""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from loadtest.serverproc import running_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(model_path) -> Iterator[str]:
    with running_server({"EGRM_MODEL": str(model_path)}) as url:
        yield url


def route_count(url: str, route: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'egrm_route_total{{route="{route}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_batch_of_two_and_metrics_move(server):
    before = route_count(server, "short")
    body = {
        "items": [{"prompt": "What is 2+2?", "response": "4"}, {"prompt": "Capital of France?", "response": "Rome"}],
        "options": {"path": "short"},
    }
    r = httpx.post(f"{server}/v1/rewards", json=body, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == [0, 1]
    assert all(sum(x["votes"].values()) == 5 for x in results)
    assert all(0.0 <= x["reward"] <= 1.0 for x in results)
    assert route_count(server, "short") == before + 2
    metrics = httpx.get(f"{server}/metrics").text
    assert 'egrm_request_latency_seconds_count{endpoint="/v1/rewards",route="short"}' in metrics
    assert "egrm_consensus_count" in metrics and "egrm_cached_prompt_tokens_total" in metrics


def test_missing_field_is_named(server):
    r = httpx.post(f"{server}/v1/rewards", json={"items": [{"prompt": "x"}]}, timeout=10)
    assert r.status_code == 422
    assert r.json()["error"]["param"] == "items[0].response"


def test_readiness(server):
    r = httpx.get(f"{server}/readyz")
    assert r.status_code == 200 and r.json()["ready"] is True


def test_model_work_does_not_block_the_event_loop(server):
    """While a long-path request is decoding, the same process still answers other requests."""
    body = {
        "items": [{"prompt": "Why is the sky blue?", "response": "Rayleigh scattering."}],
        "options": {"path": "long"},
    }
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(httpx.post, f"{server}/v1/rewards", json=body, timeout=120)
        while not _in_flight(server):
            assert not slow.done(), slow.result().text
        answered_during = httpx.get(f"{server}/healthz", timeout=10).status_code == 200 and not slow.done()
        assert slow.result().status_code == 200
    assert answered_during


def _in_flight(url: str) -> bool:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("egrm_requests_in_flight "):
            return float(line.split()[-1]) > 0
    return False
