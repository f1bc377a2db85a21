"""The OpenAI-compatible backend against a stand-in completions server (openai_stub.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from egrm.engines.base import (
    BackendRejectedError,
    BranchParams,
    EngineBusyError,
    EngineUnavailableError,
    SpareTag,
    WorkTag,
)
from egrm.engines.openai import OpenAIEngine
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.templates import JUDGE
from egrm.pipeline.types import JudgeItem, JudgeOptions, PathMode, Route
from egrm.scorer.heuristic import HeuristicScorer
from loadtest.serverproc import free_port
from tests.engines.openai_stub import StubOpenAI
from tests.engines.sglang_stub import split, unanimous
from tests.engines.stubserver import serve

LADDER = [0.6, 0.7, 0.8, 0.9, 1.0]
ITEM = JudgeItem(prompt="What is 12 + 30?", response="42")


@pytest.fixture
def server(tok) -> Iterator[tuple[StubOpenAI, str]]:
    stub = StubOpenAI(tok)
    with serve(stub.app()) as url:
        yield stub, url + "/v1"


def run(url, tok, work, **kwargs):
    async def main():
        engine = OpenAIEngine(tok, url, **kwargs)
        try:
            return await work(engine)
        finally:
            await engine.close()

    return asyncio.run(main())


def answer_params(temperatures=LADDER, seed: int | None = 7) -> list[BranchParams]:
    return [
        BranchParams(temperature=t, top_p=0.95, max_new_tokens=4, allowed=("Yes", "No"), seed=seed and seed + i)
        for i, t in enumerate(temperatures)
    ]


def options(**kw) -> JudgeOptions:
    base = dict(temperatures=LADDER, top_p=0.95, tau=0.8, path=PathMode.AUTO, template="verdict", seed=3)
    return JudgeOptions(**{**base, "long_max_tokens": 48, **kw})


def prompt_ids(tok) -> list[int]:
    return tok.encode(tok.render_chat(JUDGE.messages(ITEM)))


def test_each_temperature_is_its_own_call_with_standard_fields_only(server, tok):
    stub, url = server
    stub.answers = unanimous(" Yes", " Yes")  # the plain dialect sends no regex: the text is read
    ids = prompt_ids(tok)
    branches = run(url, tok, lambda e: e.sample(ids, answer_params()))
    assert len(stub.requests) == 5
    by_temperature = sorted(stub.requests, key=lambda r: r["temperature"])
    assert [r["temperature"] for r in by_temperature] == LADDER
    assert all(
        r
        == {
            "model": "stub-judge",
            "prompt": ids,
            "max_tokens": 4,
            "temperature": t,
            "top_p": 0.95,
            "n": 1,
            "logprobs": 1,
            "seed": 7 + i,
            "frequency_penalty": 0.0,  # sent neutral: no server default may change the method's sampling
            "presence_penalty": 0.0,
        }
        for i, (t, r) in enumerate(zip(LADDER, by_temperature, strict=True))
    )
    assert [b.text for b in branches] == [" Yes"] * 5
    assert all(b.token_ids == tok.encode(" Yes") and len(b.logprobs) == b.completion_tokens for b in branches)
    assert all(
        b.prompt_tokens == len(ids) and b.cached_prompt_tokens == 0 for b in branches
    )  # no details: none claimed


def test_identical_branches_are_one_call_with_n(server, tok):
    stub, url = server
    ids = prompt_ids(tok)
    branches = run(url, tok, lambda e: e.sample(ids, answer_params([0.8] * 5, seed=None)))
    (call,) = stub.requests
    assert call["n"] == 5 and call["prompt"] == ids
    # The server computed the prompt once: the first choice carries it, the others shared it.
    assert [b.cached_prompt_tokens for b in branches] == [0] + [len(ids)] * 4


@pytest.mark.parametrize(("dialect", "field"), [("vllm", "structured_outputs"), ("vllm-legacy", "guided_regex")])
def test_vllm_dialects_constrain_answers_with_a_regex(server, tok, dialect, field):
    stub, url = server
    stub.vllm = True
    ids = prompt_ids(tok)

    async def twice(engine):
        await engine.sample(ids, answer_params()[:1])
        return await engine.sample(ids, answer_params()[:1])

    (branch,) = run(url, tok, twice, dialect=dialect)
    sent = stub.requests[-1]
    assert sent[field] == ({"regex": " ?(Yes|No)"} if dialect == "vllm" else " ?(Yes|No)")
    assert sent["return_tokens_as_token_ids"] is True
    # vLLM names the sampled ids in the log-probs, the end of turn last: not one of the branch's.
    assert branch.token_ids == tok.encode(" Yes") and len(branch.logprobs) == branch.completion_tokens
    # vLLM fills what a request leaves out from the model's generation_config.json: pinned neutral.
    assert (sent["top_k"], sent["min_p"], sent["repetition_penalty"]) == (-1, 0.0, 1.0)
    assert branch.cached_prompt_tokens == len(ids) // 16 * 16  # vLLM's block-sized prefix-cache hit


@pytest.mark.parametrize(("dialect", "ranked"), [("vllm", True), ("vllm-legacy", False), ("openai", False)])
def test_spare_and_background_work_carry_vllms_request_priority(server, tok, dialect, ranked):
    """Live work keeps vLLM's default priority (0, nothing sent); the long path's spare candidates
    go as 1, work nobody waits for any more as 2, to vLLM; neither a plain OpenAI server (it is
    vLLM's field) nor a vLLM before 0.12 (vllm-legacy: its V0 engine refused it under fcfs) gets it."""
    stub, url = server
    stub.vllm = True
    ids = prompt_ids(tok)
    spare = SpareTag("request", lambda: False)
    orphan = WorkTag("request", lambda: False)

    async def ranked_calls(engine):
        live = await engine.sample(ids, answer_params()[:1], tag="request")
        await engine.sample(ids, answer_params()[:1], tag=spare)
        await engine.continue_branches([live[0].handle], " more", answer_params()[:1], tag=orphan)
        await engine.continue_branches(
            [live[0].handle], " more", answer_params()[:1], tag=SpareTag(spare, lambda: True)
        )

    run(url, tok, ranked_calls, dialect=dialect)
    sent = [r.get("priority") for r in stub.requests]
    assert sent == ([None, 1, 2, None] if ranked else [None] * 4)  # a spare once needed is live work


@pytest.mark.parametrize(("tokenize", "ready"), [("same", True), ("other", False), ("absent", True), ("refuse", True)])
def test_readiness_compares_the_servers_tokenizer_once(server, tok, caplog, tokenize, ready):
    """egrm sends token ids: a vLLM whose model reads the probe otherwise is refused (not ready, and
    every call a 503 that says why, before anything is sent); one that does not serve /tokenize, or
    refuses the request, is taken as it is (logged). Live against a real vLLM in test_vllm_live.py."""
    stub, url = server
    stub.vllm, stub.version, stub.tokenize = True, "0.12.0", tokenize

    async def twice(engine):
        first, again = await engine.ready(), await engine.ready()
        try:
            await engine.sample(prompt_ids(tok), answer_params()[:1])
        except EngineUnavailableError as exc:
            return first, again, str(exc)
        return first, again, None

    first, again, refused = run(url, tok, twice, dialect="vllm")
    assert first is again is ready
    if ready:
        assert refused is None and len(stub.requests) == 1
    else:
        assert "tokenizes text otherwise than EGRM_MODEL's tokenizer" in refused and not stub.requests
    assert ("cannot compare the tokenizer" in caplog.text) is (tokenize in ("absent", "refuse"))


@pytest.mark.parametrize(
    ("dialect", "version", "ready"),
    [
        ("vllm-legacy", "0.12.0", False),
        ("vllm-legacy", "0.13.1rc1.dev4+g1a2b3c", False),
        ("vllm-legacy", "0.11.2", True),
        ("vllm", "0.12.0", True),
    ],
)
def test_vllm_legacy_is_refused_by_a_vllm_that_ignores_guided_regex(server, tok, caplog, dialect, version, ready):
    stub, url = server
    stub.vllm, stub.version = True, version

    async def probe(engine):
        up = await engine.ready()
        try:
            await engine.sample([1, 2, 3], answer_params()[:1])
        except EngineUnavailableError as exc:
            return up, str(exc)
        return up, None

    up, refusal = run(url, tok, probe, dialect=dialect)
    assert up is ready and (refusal is None) is ready
    if not ready:
        assert "EGRM_OPENAI_DIALECT=vllm" in refusal and version in refusal and stub.requests == []
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [refusal]


def test_vllm_legacy_on_a_server_without_version_is_taken_as_it_is(server, tok):
    stub, url = server  # not vLLM: GET /version is 404

    async def probe(engine):
        return await engine.ready(), await engine.sample([1, 2, 3], answer_params()[:1])

    up, branches = run(url, tok, probe, dialect="vllm-legacy")
    assert up and len(branches) == 1


def test_pipeline_short_and_long_path_through_an_openai_server(server, tok, checker):
    stub, url = server

    def pipeline(engine):
        return RewardPipeline(engine, HeuristicScorer(), checker)

    short = run(url, tok, lambda e: pipeline(e).score_item(ITEM, options()))
    assert short.route is Route.SHORT and short.answer == "Yes" and short.reward == 1.0
    stub.answers = split("42", "41")
    stub.requests.clear()
    long = run(url, tok, lambda e: pipeline(e).score_item(ITEM, options()))
    assert long.route is Route.LONG and long.error is None and len(long.candidates) == 5
    assert [c.answer for c in long.candidates] == ["42"] * 5 and long.reward == 1.0
    assert len(stub.requests) == 10  # 5 answers, 5 reasoning continuations; the verifier did the rest
    cue = tok.encode(JUDGE.reasoning_cue)
    reasoning = [r for r in stub.requests if r["prompt"][-len(cue) :] == cue]
    assert len(reasoning) == 5 and all(r["prompt"][: len(prompt_ids(tok))] == prompt_ids(tok) for r in reasoning)


def test_api_key_is_sent_and_a_wrong_one_is_unavailable_without_echoing_it(server, tok):
    stub, url = server
    stub.api_key = "right-key"
    stub.answers = unanimous(" Yes", " Yes")
    (ok,) = run(url, tok, lambda e: e.sample([1, 2, 3], answer_params()[:1]), api_key="right-key")
    assert ok.text == " Yes"

    async def wrong(engine):
        ready = await engine.ready()
        with pytest.raises(EngineUnavailableError, match="HTTP 401: Incorrect API key provided") as caught:
            await engine.sample([1, 2, 3], answer_params()[:1])
        return ready, str(caught.value)

    ready, message = run(url, tok, wrong, api_key="wrong-key")
    assert not ready and "wrong-key" not in message


@pytest.mark.parametrize(
    ("status", "body", "error", "words"),
    [
        (
            500,
            b'{"error": {"message": "engine dead", "type": "InternalServerError", "code": 500}}',
            EngineUnavailableError,
            "HTTP 500: engine dead",
        ),
        (429, b'{"error": {"message": "slow down", "type": "rate_limit", "code": 429}}', EngineBusyError, "slow down"),
        (
            400,
            b'{"error": {"message": "max_tokens too large", "type": "BadRequestError", "code": 400}}',
            BackendRejectedError,
            "max_tokens too large",
        ),
        (200, b'{"choices": [{"text": "Yes"}]}', EngineUnavailableError, "malformed"),
    ],
)
def test_server_failures_are_clear_errors(server, tok, status, body, error, words):
    stub, url = server
    stub.failures.append((status, body, "application/json"))
    with pytest.raises(error, match=words):
        run(url, tok, lambda e: e.sample([1, 2, 3], answer_params()[:1]), model="stub-judge")


def test_a_failed_branch_cancels_its_siblings(server, tok):
    stub, url = server
    stub.failures.append((500, b"boom", "text/plain"))
    with pytest.raises(EngineUnavailableError):
        run(url, tok, lambda e: e.sample([1, 2, 3], answer_params()), model="stub-judge")


def test_unreachable_server(tok):
    url = f"http://127.0.0.1:{free_port()}/v1"

    async def try_it(engine):
        with pytest.raises(EngineUnavailableError, match="unreachable"):
            await engine.sample([1, 2, 3], answer_params())
        return await engine.ready()

    assert run(url, tok, try_it, model="m") is False
