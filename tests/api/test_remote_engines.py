"""The HTTP API on the remote engines, built by the app's own lifespan from settings, against stand-ins."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from egrm.config import Settings
from egrm.main import create_app
from loadtest.serverproc import free_port
from tests.engines.openai_stub import StubOpenAI
from tests.engines.sglang_stub import StubRuntime, split
from tests.engines.stubserver import serve

ITEM = {"prompt": "What is 12 + 30?", "response": "42"}


@pytest.fixture
def sglang(tok) -> Iterator[StubRuntime]:
    stub = StubRuntime(tok)
    with serve(stub.app()) as url:
        stub.url = url  # type: ignore[attr-defined]
        yield stub


def client(model_path, **settings) -> TestClient:
    return TestClient(create_app(Settings(model=str(model_path), **settings)))


def test_rewards_short_and_long_path_on_sglang(sglang, model_path):
    # The whole long path (no early stop): every candidate in one call, on the wire counted below.
    with client(model_path, engine="sglang", sglang_url=sglang.url, long_accept=0) as c:
        assert c.get("/readyz").json() == {"ready": True, "engine": True, "scorer": True, "store": "in-process"}
        short = c.post("/v1/rewards", json={"items": [ITEM], "options": {"seed": 1}})
        sglang.answers = split("12+30=42", "12+30=41")  # the judge's samples disagree: the long path
        # Another seed is other work (the same one would read the first request's, kept).
        long = c.post("/v1/rewards", json={"items": [ITEM], "options": {"seed": 2}})
    assert short.status_code == 200 and long.status_code == 200, (short.text, long.text)
    assert short.json()["model"] == sglang.model_path  # the runtime's own model id
    (s,), (lng,) = short.json()["results"], long.json()["results"]
    assert s["route"] == "short" and s["reward"] == 1.0 and s["error"] is None
    assert lng["route"] == "long" and len(lng["candidates"]) == 5 and lng["answer"] in ("Yes", "No")
    assert short.json()["usage"]["cached_prompt_tokens"] > 0
    assert lng["verdict_by"] == "equivalence" and lng["verdict"] == "Yes"  # the reasoning reaches 42
    # The answers read as numbers, so no Yes/No turn: short: warm-up, batch; long: + the reasoning.
    assert len(sglang.requests) == 2 + 3


def test_runtime_down_is_503_and_not_ready(model_path):
    url = f"http://127.0.0.1:{free_port()}"
    with client(model_path, engine="sglang", sglang_url=url) as c:
        ready = c.get("/readyz")
        r = c.post("/v1/rewards", json={"items": [ITEM, ITEM]})
    assert ready.status_code == 503 and ready.json()["engine"] is False
    assert r.status_code == 503 and r.headers["retry-after"]
    error = r.json()["error"]
    assert error["type"] == "engine_unavailable" and url in error["message"] and "unreachable" in error["message"]


def test_a_runtime_without_text_keeps_the_service_not_ready_and_says_why(tok, model_path):
    stub = StubRuntime(tok, skip_tokenizer_init=True)  # started with --skip-tokenizer-init
    with serve(stub.app()) as url, client(model_path, engine="sglang", sglang_url=url) as c:
        ready = c.get("/readyz")
        r = c.post("/v1/rewards", json={"items": [ITEM]})
    assert ready.status_code == 503 and ready.json()["engine"] is False
    assert r.status_code == 503 and "--skip-tokenizer-init" in r.json()["error"]["message"]
    assert stub.requests == []


def test_runtime_http_500_is_503_and_a_rejected_item_is_a_per_item_error(sglang, model_path):
    with client(model_path, engine="sglang", sglang_url=sglang.url) as c:
        sglang.failures.append((500, b"Internal Server Error", "text/plain"))
        failed = c.post("/v1/rewards", json={"items": [ITEM]})
        sglang.failures.append((400, b'{"error": {"message": "bad input"}}', "application/json"))
        rejected = c.post("/v1/rewards", json={"items": [ITEM]})
    assert failed.status_code == 503 and "HTTP 500" in failed.json()["error"]["message"]
    assert rejected.status_code == 200
    (item,) = rejected.json()["results"]
    assert item["reward"] is None and "bad input" in item["error"]["message"]


def test_rewards_on_an_openai_compatible_server(tok, model_path):
    stub = StubOpenAI(tok, api_key="sk-test")
    with serve(stub.app()) as url:
        with client(model_path, engine="openai", openai_url=url + "/v1", openai_api_key="sk-test") as c:
            ready = c.get("/readyz")
            r = c.post("/v1/rewards", json={"items": [ITEM]})
    assert ready.status_code == 200 and r.status_code == 200, r.text
    assert r.json()["results"][0]["answer"] == "Yes" and r.json()["model"] == "stub-judge"


def test_vllm_legacy_against_a_vllm_without_guided_regex_is_not_ready_and_says_why(tok, model_path):
    stub = StubOpenAI(tok, vllm=True, version="0.12.0")
    with serve(stub.app()) as url:
        with client(model_path, engine="openai", openai_url=url + "/v1", openai_dialect="vllm-legacy") as c:
            ready = c.get("/readyz")
            r = c.post("/v1/rewards", json={"items": [ITEM]})
    assert ready.status_code == 503 and ready.json()["engine"] is False
    assert r.status_code == 503 and "EGRM_OPENAI_DIALECT" in r.json()["error"]["message"]
    assert stub.requests == []


def test_openai_engine_needs_its_url(model_path):
    with pytest.raises(ValueError, match="EGRM_OPENAI_URL is required"):
        Settings(model=str(model_path), engine="openai")


def test_early_stop_on_sglang_sends_the_first_candidate_apart_and_the_spares_beside_it(sglang, model_path):
    # The stub's reasoning holds, and the scorer rates it 0.49 (its log-probs are the stub's): accepted at 0.4.
    with client(model_path, engine="sglang", sglang_url=sglang.url, long_accept=0.4) as c:
        sglang.answers = split("12+30=42", "12+30=41")  # the judge's samples disagree: the long path
        r = c.post("/v1/rewards", json={"items": [ITEM], "options": {"seed": 2}})
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    (candidate,) = result["candidates"]  # the first alone decided
    assert candidate["answer"] == "42" and candidate["score"] >= 0.4 and result["verdict"] == "Yes"
    # A remote runtime cannot rank work: the four spare candidates went out at once, in a call of their own.
    prompts = [len(body["input_ids"]) if isinstance(body["input_ids"][0], list) else 1 for body in sglang.requests]
    assert prompts == [1, 5, 1, 4], prompts  # warm-up, the samples; the first candidate, the spares
