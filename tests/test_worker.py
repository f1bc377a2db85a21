"""`egrm scorer` as a real process on loopback: the /v1/score contract, its errors and its metrics."""

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from egrm.scorer.registry import load_scorer
from egrm.scorer.wire import MAX_ANSWER_CHARS, MAX_BODY_BYTES, MAX_CANDIDATES, MAX_TEXT_CHARS
from loadtest.serverproc import scorer_process
from tests.live import metric
from tests.scorer.test_wiring import CANDIDATE

pytestmark = pytest.mark.slow

GOOD = dataclasses.asdict(CANDIDATE)


@pytest.fixture(scope="module")
def worker() -> Iterator[str]:
    with scorer_process() as (url, _):
        yield url


def score(url: str, body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/score", json=body, timeout=10)


def test_scores_come_back_in_order_from_the_loaded_scorer(worker):
    candidates = [
        dataclasses.replace(CANDIDATE, agreement=a, answer=ans) for a, ans in [(0.2, "No"), (1.0, "Yes"), (0.0, None)]
    ]
    r = score(worker, {"candidates": [dataclasses.asdict(c) for c in candidates]})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "scores": asyncio.run(load_scorer(None).score(candidates)),
        "scorer": "TrainedScorer",
        "calibrated": True,  # its score is a probability of being right: early stop may act on it
    }


@pytest.mark.parametrize(
    ("candidates", "param"),
    [
        ([{k: v for k, v in GOOD.items() if k != "reasoning"}], "candidates[0].reasoning"),
        ([GOOD, {**GOOD, "agreement": 1.5}], "candidates[1].agreement"),
        ([{**GOOD, "tokens": -1}], "candidates[0].tokens"),
        ([{**GOOD, "mean_logprob": "high"}], "candidates[0].mean_logprob"),
        ([{**GOOD, "answer": "x" * (MAX_ANSWER_CHARS + 1)}], "candidates[0].answer"),
        ([{**GOOD, "prompt": "x" * (MAX_TEXT_CHARS + 1)}], "candidates[0].prompt"),
        ([{**GOOD, "colour": "red"}], "candidates[0].colour"),
        ([], "candidates"),
        ([GOOD] * (MAX_CANDIDATES + 1), "candidates"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(worker, candidates, param):
    r = score(worker, {"candidates": candidates})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and param in error["message"]


def test_non_finite_numbers_and_broken_json_are_refused(worker):
    nan = b'{"candidates": [{"prompt": "p", "response": "r", "reasoning": "x", "answer": "Yes", '
    nan += b'"mean_logprob": NaN, "agreement": 0.5, "tokens": 3}]}'
    headers = {"content-type": "application/json"}
    r = httpx.post(f"{worker}/v1/score", content=nan, headers=headers)
    assert r.status_code == 422 and r.json()["error"]["param"] == "candidates[0].mean_logprob"
    r = httpx.post(f"{worker}/v1/score", content=b"{not json", headers=headers)
    assert r.status_code == 422 and r.json()["error"]["type"] == "invalid_request_error"


def test_an_oversized_body_is_refused_before_parsing(worker):
    r = httpx.post(
        f"{worker}/v1/score", content=b"x" * (MAX_BODY_BYTES + 1), headers={"content-type": "application/json"}
    )
    error = r.json()["error"]
    assert r.status_code == 413 and error["param"] == "body" and "worker's limit" in error["message"]


def test_metrics_count_requests_latency_and_candidates(worker):
    before = {s: metric(worker, s) for s in _SERIES}
    assert score(worker, {"candidates": [GOOD] * 3}).status_code == 200
    assert score(worker, {"candidates": []}).status_code == 422
    after = {s: metric(worker, s) for s in _SERIES}
    assert {s: after[s] - before[s] for s in _SERIES} == {
        'egrm_scorer_worker_requests_total{status="200"}': 1,
        'egrm_scorer_worker_requests_total{status="422"}': 1,
        "egrm_scorer_worker_request_latency_seconds_count": 2,
        "egrm_scorer_worker_candidates_total": 3,
    }


_SERIES = (
    'egrm_scorer_worker_requests_total{status="200"}',
    'egrm_scorer_worker_requests_total{status="422"}',
    "egrm_scorer_worker_request_latency_seconds_count",
    "egrm_scorer_worker_candidates_total",
)


def test_health_and_readiness(worker):
    assert httpx.get(f"{worker}/healthz").json() == {"status": "ok"}
    r = httpx.get(f"{worker}/readyz")
    assert r.status_code == 200 and r.json() == {"ready": True, "calibrated": True}


def test_a_bad_checkpoint_stops_the_worker_with_a_clear_message(tmp_path):
    cli = [sys.executable, "-m", "egrm.cli", "scorer", "--port", "1", "--checkpoint", str(tmp_path)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "not a scorer checkpoint" in done.stderr and str(tmp_path) in done.stderr


def test_the_worker_serves_the_shipped_trained_scorer_when_asked():
    with scorer_process(args=["--checkpoint", "trained"]) as (url, _):
        r = score(url, {"candidates": [dataclasses.asdict(CANDIDATE)]})
    assert r.status_code == 200, r.text
    scores = asyncio.run(load_scorer("trained").score([CANDIDATE]))
    assert r.json() == {"scores": scores, "scorer": "TrainedScorer", "calibrated": True}
