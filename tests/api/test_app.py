"""The HTTP contract in-process (lifespan run by TestClient), on the real model."""

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from egrm.config import Settings
from egrm.main import create_app
from egrm.pipeline.templates import JUDGE

pytestmark = pytest.mark.slow

ITEM = {"prompt": "What is 2+2?", "response": "4"}


@pytest.fixture(scope="module")
def client(engine) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(max_items=4), engine=engine)) as c:
        yield c


def post(client: TestClient, body: dict):
    return client.post("/v1/rewards", json=body)


def assert_error(response, status: int, param: str):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] and param.split(".")[-1].split("[")[0] in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"items": [{"response": "4"}]}, "items[0].prompt"),
        ({"items": [ITEM, {"prompt": "x"}]}, "items[1].response"),
        ({"items": []}, "items"),
        ({}, "items"),
        ({"items": [ITEM], "options": {"m": 17}}, "options.m"),
        ({"items": [ITEM], "options": {"m": 0}}, "options.m"),
        ({"items": [ITEM], "options": {"m": 3, "temperatures": [0.5]}}, "options.temperatures"),
        ({"items": [ITEM], "options": {"temperatures": [3.0]}}, "options.temperatures[0]"),
        ({"items": [ITEM], "options": {"tau": 1.5}}, "options.tau"),
        ({"items": [ITEM], "options": {"top_p": 0}}, "options.top_p"),
        ({"items": [ITEM], "options": {"path": "medium"}}, "options.path"),
        ({"items": [ITEM], "options": {"consensus": "vibes"}}, "options.consensus"),
        ({"items": [ITEM], "options": {"template": "essay"}}, "options.template"),
        ({"items": [{**ITEM, "colour": "red"}]}, "items[0].colour"),
        ({"items": [ITEM], "options": {"template": "pairwise"}}, "items[0].response_b"),
    ],
)
def test_bad_input_names_the_field(client, body, param):
    assert_error(post(client, body), 422, param)


def test_too_many_items(client):
    assert_error(post(client, {"items": [ITEM] * 5}), 413, "items")


def test_malformed_json_and_unknown_route_keep_the_error_shape(client):
    r = client.post("/v1/rewards", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "error" in r.json()
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_short_path_result(client):
    body = {"items": [{**ITEM, "id": "q1"}], "options": {"path": "short", "return_samples": True, "seed": 1}}
    r = post(client, body)
    assert r.status_code == 200, r.text
    data = r.json()
    (result,) = data["results"]
    assert result["id"] == "q1" and result["route"] == "short" and result["index"] == 0
    assert sum(result["votes"].values()) == 5 and result["consensus"] == max(result["votes"].values()) / 5
    assert [s["temperature"] for s in result["samples"]] == [0.6, 0.7, 0.8, 0.9, 1.0]
    # Solve first: each sample is the judge's own answer, and votes for its class of equal answers.
    assert sorted(s["vote"] for s in result["samples"]) == sorted(
        v for v, n in result["votes"].items() for _ in range(n)
    )
    # "4" reads as a number on both sides, so the verifier decided: the share of samples equal to it.
    (judgement,) = result["judgements"]
    assert result["verdict_by"] == judgement["verdict_by"] == "equivalence"
    assert judgement["response_answer"] == "4" and judgement["judge_answer"] == max(
        result["votes"], key=result["votes"].get
    )
    assert result["reward"] == pytest.approx(result["votes"].get("4", 0) / 5) == judgement["p"]
    assert result["answer"] == result["verdict"] == ("Yes" if judgement["judge_answer"] == "4" else "No")
    assert result["candidates"] is None
    assert 0 < result["exact_consensus"] <= 1  # the shipped routing policy reads the greedy answer's probability
    usage = data["usage"]
    # Five rows over one prefill of the prompt, and no follow-up turn (the verifier decided).
    computed = usage["prompt_tokens"] - usage["cached_prompt_tokens"]
    assert 0 < computed < 2 * usage["prompt_tokens"] // 5
    assert 5 <= usage["completion_tokens"] <= 5 * JUDGE.answer_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_exact_consensus_option(client):
    body = {"items": [ITEM], "options": {"path": "short", "seed": 1, "consensus": "exact"}}
    (result,) = post(client, body).json()["results"]
    assert 0 < result["exact_consensus"] <= 1 and result["consensus"] == result["exact_consensus"]
    assert sum(result["votes"].values()) == 5 and result["answer"] in ("Yes", "No")


def test_long_path_result(client):
    body = {"items": [ITEM], "options": {"path": "long", "m": 3, "seed": 2, "template": "score"}}
    (result,) = post(client, body).json()["results"]
    # All three candidates, or (early stop) the first alone where the scorer accepted it.
    candidates = result["candidates"]
    assert result["route"] == "long"
    assert len(candidates) == 3 or (len(candidates) == 1 and candidates[0]["score"] >= 0.9)
    (judgement,) = result["judgements"]
    weight = {}
    for c in result["candidates"]:
        if c["answer"] is not None:
            weight[c["answer"]] = weight.get(c["answer"], 0) + max(c["score"], 0)
    # The score is the same judgement on a 1..10 scale: p from the candidates' score-weighted vote.
    assert judgement["judge_answer"] == max(weight, key=weight.get)
    assert result["reward"] == pytest.approx(weight.get("4", 0) / sum(weight.values()))
    assert result["answer"] == str(1 + int(9 * result["reward"] + 0.5))
    assert result["timings"]["reasoning_ms"] > 0 and result["timings"]["total_ms"] >= result["timings"]["sample_ms"]


def test_pairwise_result(client):
    body = {"items": [{**ITEM, "response_b": "5"}], "options": {"path": "short", "seed": 3, "template": "pairwise"}}
    (result,) = post(client, body).json()["results"]
    a, b = result["judgements"]
    assert (a["response_answer"], b["response_answer"]) == ("4", "5") and result["verdict"] is None
    assert result["reward"] == pytest.approx(0.5 + (a["p"] - b["p"]) / 2)
    assert result["answer"] == ("A" if a["p"] > b["p"] else "B" if b["p"] > a["p"] else "tie")


def test_auto_routing_follows_tau(client):
    # tau 0 sends everything short; tau above 1/m... only unanimity (tau 1) can still be short.
    (short,) = post(client, {"items": [ITEM], "options": {"tau": 0.0}}).json()["results"]
    assert short["route"] == "short"
    (r,) = post(client, {"items": [ITEM], "options": {"tau": 1.0, "seed": 5}}).json()["results"]
    assert r["route"] == ("short" if r["consensus"] == 1.0 else "long")


def test_seeded_requests_are_reproducible(client):
    body = {"items": [ITEM], "options": {"seed": 11, "return_samples": True, "path": "short"}}
    first, second = post(client, body).json()["results"][0], post(client, body).json()["results"][0]
    assert first["samples"] == second["samples"]


def test_prompt_over_the_token_limit_is_refused_naming_the_item(client):
    huge = {"prompt": "word " * 5000, "response": "4"}
    r = post(client, {"items": [ITEM, huge]})
    assert_error(r, 413, "items[1]")
    assert "EGRM_MAX_PROMPT_TOKENS" in r.json()["error"]["message"]
    # Solve first, the response is not in the first prompt but in the follow-up turn: it counts too.
    r = post(client, {"items": [{"prompt": "What is 2+2?", "response": "word " * 5000}, ITEM]})
    assert_error(r, 413, "items[0]")


def test_item_too_long_for_the_model_gets_its_own_error(engine):
    # With the request limit above the model's context, the engine's own check answers per item.
    with TestClient(create_app(Settings(max_prompt_tokens=100_000), engine=engine)) as c:
        r = post(c, {"items": [ITEM, {"prompt": "word " * 9000, "response": "4"}], "options": {"path": "short"}})
    assert r.status_code == 200
    ok, bad = r.json()["results"]
    assert ok["error"] is None and ok["reward"] is not None
    assert bad["reward"] is None and bad["error"]["param"] == "items[1]" and "context" in bad["error"]["message"]


def test_odd_unicode_empty_and_large_strings(client):
    r = client.post(
        "/v1/rewards",
        content=b'{"items": [{"prompt": "bad \\ud800 text", "response": "x"}]}',
        headers={"content-type": "application/json"},
    )
    assert_error(r, 422, "items[0].prompt")  # a lone surrogate: not valid Unicode
    odd = {
        "prompt": "Wie viel ist 2+2? \u0000 \u202e ZWJ:\u200d emoji: \U0001f600 CJK: \u4e8c\u52a0\u4e8c",
        "response": "",
    }
    (result,) = post(client, {"items": [odd], "options": {"path": "short"}}).json()["results"]
    assert result["error"] is None and result["answer"] in ("Yes", "No")


def test_a_request_that_can_never_fit_the_engine_queue_is_refused_once(engine):
    with TestClient(create_app(Settings(max_queue=3), engine=engine)) as c:
        r = post(c, {"items": [ITEM] * 4})
        pair = {**ITEM, "response_b": "5"}
        pairwise = post(c, {"items": [pair] * 2, "options": {"template": "pairwise"}})  # two jobs an item
    for refused in (r, pairwise):
        assert refused.status_code == 413 and refused.json()["error"]["param"] == "items", refused.text
        assert "EGRM_MAX_QUEUE=3" in refused.json()["error"]["message"]


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"ready": True, "engine": True, "scorer": True, "store": "in-process"}


def test_a_full_engine_queue_gives_429_with_retry_after(loaded_fp32):
    from egrm.engines.embedded.engine import EmbeddedEngine
    from tests.engines.test_batching import hold_model_thread

    engine = EmbeddedEngine(loaded_fp32, max_queue=1)
    try:
        with TestClient(create_app(Settings(), engine=engine)) as c:
            release = hold_model_thread(engine)
            queued = engine.call(lambda: None)  # the one queue slot is taken
            r = post(c, {"items": [ITEM]})
            release.set()
            queued.result(timeout=10)
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["type"] == "rate_limit_error"
            assert post(c, {"items": [ITEM]}).status_code == 200  # and it recovers
    finally:
        import asyncio

        asyncio.run(engine.close())


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/rewards", '{"items": [{"prompt": "What is 2+2?", "response": "4\\ud800"}]}', "items[0].response"),
        ("/get_reward", '{"query": ["a\\ud800 4"], "prompts": ["a"]}', "query[0]"),
        (
            "/v1/chat/completions",
            '{"model": "egrm", "messages": [{"role": "user", "content": "a\\udc00"}, '
            '{"role": "assistant", "content": "4"}]}',
            "messages[0].content",
        ),
    ],
)
def test_a_lone_surrogate_is_refused_naming_the_field_on_every_route(client, path, body, param):
    r = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
    invalid = 400 if path.startswith("/v1/chat/") else 422  # OpenAI's routes answer as OpenAI does
    assert r.status_code == invalid and r.json()["error"]["param"] == param, r.text
    assert "surrogate" in r.json()["error"]["message"] or "unicode" in r.json()["error"]["message"]


def test_text_holding_the_old_in_band_marker_is_plain_text(client):
    """U+241F once split the verdict turn in two: no character of user text has a meaning now."""
    marked = {"prompt": "What is 2+2? \u241f", "response": "\u241f 4 \u241f", "reference": None}
    plain = {"prompt": "What is 2+2?", "response": "4"}
    options = {"path": "short", "seed": 2}
    a, b = (post(client, {"items": [item], "options": options}).json()["results"][0] for item in (marked, plain))
    assert a["error"] is None and a["judgements"][0]["response_answer"] == "4"
    assert (a["verdict"], a["verdict_by"]) == (b["verdict"], b["verdict_by"]) == ("Yes", "equivalence")


def test_the_judges_routing_policy_routes_and_the_answer_says_so(engine, tmp_path):
    from egrm.pipeline.routing import RoutingPolicy

    path = tmp_path / "policy.json"
    RoutingPolicy("calibrated here", 0.8, min_exact=0.5).save(path)
    item = {"prompt": "What is 2+2?", "response": "4"}
    with TestClient(create_app(Settings(routing_policy=str(path)), engine=engine)) as c:
        routed = c.post("/v1/rewards", json={"items": [item]}).json()
        own_tau = c.post("/v1/rewards", json={"items": [item], "options": {"tau": 0.6}}).json()
    assert routed["routing"] == "calibrated here: consensus >= 0.8, exact >= 0.5"
    assert own_tau["routing"] == "tau=0.6"  # a request that names its tau routes on it
    assert routed["results"][0]["samples_drawn"] == 5


def test_the_shipped_judge_routes_on_its_calibrated_policy_unless_told_none(client, engine):
    item = {"prompt": "What is 2+2?", "response": "4"}
    shipped = post(client, {"items": [item]}).json()
    assert shipped["routing"] == "calibrated on builtin:arith-mixed: consensus >= 0.6, exact >= 0.9"
    assert 0 < shipped["results"][0]["exact_consensus"] <= 1  # the policy reads the greedy answer's probability
    with TestClient(create_app(Settings(routing_policy="none"), engine=engine)) as c:
        plain = c.post("/v1/rewards", json={"items": [item]}).json()
    assert plain["routing"] == "tau=0.8" and plain["results"][0]["exact_consensus"] is None
