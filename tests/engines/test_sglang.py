"""The SGLang backend against a stand-in runtime that speaks SGLang's wire format (sglang_stub.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator

import pytest

from egrm.engines.base import BackendRejectedError, BranchParams, EngineUnavailableError, FinishReason
from egrm.engines.remote.answers import answers_regex
from egrm.engines.sglang import NEUTRAL, SGLangEngine
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.templates import JUDGE
from egrm.pipeline.types import JudgeItem, JudgeOptions, PathMode, Route, VerdictBy
from egrm.scorer.heuristic import HeuristicScorer
from loadtest.serverproc import free_port
from tests.engines.sglang_stub import REASONING, StubRuntime, split, unanimous
from tests.engines.stubserver import serve

LADDER = [0.6, 0.7, 0.8, 0.9, 1.0]
ITEM = JudgeItem(prompt="What is 12 + 30?", response="42")


@pytest.fixture
def runtime(tok) -> Iterator[tuple[StubRuntime, str]]:
    stub = StubRuntime(tok)
    with serve(stub.app()) as url:
        yield stub, url


def run(url, tok, work, **kwargs):
    """Run work(engine) on a fresh engine in its own loop, closing the engine after."""

    async def main():
        engine = SGLangEngine(tok, url, **kwargs)
        try:
            return await work(engine)
        finally:
            await engine.close()

    return asyncio.run(main())


def answer_params(seed: int | None = 7) -> list[BranchParams]:
    return [
        BranchParams(
            temperature=t, top_p=0.95, max_new_tokens=4, allowed=("Yes", "No"), seed=None if seed is None else seed + i
        )
        for i, t in enumerate(LADDER)
    ]


def options(**kw) -> JudgeOptions:
    base = dict(
        temperatures=LADDER, top_p=0.95, tau=0.8, path=PathMode.AUTO, template="verdict", seed=3, long_max_tokens=48
    )
    return JudgeOptions(**{**base, **kw})


def test_answers_regex_allows_each_answer_bare_or_after_one_space():
    verdict = answers_regex(("Yes", "No"))
    assert all(re.fullmatch(verdict, s) for s in ("Yes", " Yes", "No", " No"))
    assert not any(re.fullmatch(verdict, s) for s in ("Yes.", "  Yes", "Ye", "yes", "YesNo", ""))
    scores = answers_regex(tuple(str(i) for i in range(1, 11)))
    assert all(re.fullmatch(scores, s) for s in ("1", " 10", "9"))
    assert not any(re.fullmatch(scores, s) for s in ("0", "11", "101"))
    assert not re.fullmatch(answers_regex(("a.b",)), "axb")  # answers are escaped, not patterns


def test_sample_warms_the_prefix_then_sends_all_branches_in_one_call(runtime, tok):
    stub, url = runtime
    stub.answers = unanimous(" Yes")
    ids = tok.encode(tok.render_chat(JUDGE.messages(ITEM)))
    branches = run(url, tok, lambda e: e.sample(ids, answer_params()))
    warm, batch = stub.requests  # exactly two calls
    assert warm == {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}}
    assert batch["input_ids"] == [ids] * 5
    assert batch["return_logprob"] is True and batch["logprob_start_len"] == [len(ids) - 1] * 5
    assert [p["temperature"] for p in batch["sampling_params"]] == LADDER
    assert all(
        p
        == {
            "temperature": t,
            "top_p": 0.95,
            **NEUTRAL,
            "max_new_tokens": 4,
            "regex": " ?(Yes|No)",
            "sampling_seed": 7 + i,
        }
        for i, (t, p) in enumerate(zip(LADDER, batch["sampling_params"], strict=True))
    )
    assert [b.text for b in branches] == [" Yes"] * 5
    assert all(b.finish_reason is FinishReason.STOP and b.prompt_tokens == len(ids) for b in branches)
    # The runtime returns the EOS that ended each branch; as the embedded engine counts a branch,
    # it is not one of its tokens, nor is its log-prob part of the answer's probability.
    assert all(b.token_ids == tok.encode(" Yes") and len(b.logprobs) == b.completion_tokens for b in branches)
    # The runtime computed the prompt once (the warm-up, paid by branch 0); each branch reused all but
    # its last token (SGLang always computes one).
    assert branches[0].cached_prompt_tokens == 0
    assert [b.cached_prompt_tokens for b in branches[1:]] == [len(ids) - 1] * 4


def test_without_the_warm_up_the_batch_would_not_share_the_prefix(runtime, tok):
    """The stand-in's cache is what makes the warm-up matter: a cold batch hits nothing."""
    stub, url = runtime
    ids = tok.encode("a prompt that nobody sent before")

    async def cold_then_warm(engine):
        cold = await engine._generate({"input_ids": [ids] * 3, "sampling_params": [{"max_new_tokens": 1}] * 3})
        return cold, await engine.sample(ids, answer_params()[:3])

    cold, warm = run(url, tok, cold_then_warm)
    assert [o.cached_tokens for o in cold] == [0, 0, 0]
    assert [b.cached_prompt_tokens for b in warm[1:]] == [len(ids) - 1] * 2


def test_continue_sends_each_branch_context_in_one_call_and_hits_the_cache(runtime, tok):
    stub, url = runtime
    stub.answers = split(" Yes", "No")
    ids = tok.encode(tok.render_chat(JUDGE.messages(ITEM)))
    cue = JUDGE.reasoning_cue
    reason = BranchParams(temperature=0.7, max_new_tokens=64, stop=("Final answer:",))

    async def sample_then_continue(engine):
        first = await engine.sample(ids, answer_params(None)[:2])
        return first, await engine.continue_branches([b.handle for b in first], cue, [reason, reason])

    first, second = run(url, tok, sample_then_continue)
    call = stub.requests[-1]
    own = [tok.encode(" Yes"), tok.encode("No")]  # the sampled tokens, without the EOS that ended them
    assert call["input_ids"] == [[*ids, *o, *tok.encode(cue)] for o in own]
    assert (
        call["sampling_params"]
        == [{"temperature": 0.7, "top_p": 1.0, **NEUTRAL, "max_new_tokens": 64, "stop": ["Final answer:"]}] * 2
    )
    # Everything but the appended cue was in the runtime's cache: the prefix is never prefilled again.
    assert [b.cached_prompt_tokens for b in second] == [len(ids) + len(o) for o in own]
    assert all(b.text == REASONING and b.finish_reason is FinishReason.STOP for b in second)


def test_handles_of_another_engine_are_refused(runtime, tok):
    _, url = runtime

    async def mixed(engine):
        other = SGLangEngine(tok, url)
        try:
            (branch,) = await other.sample([1, 2, 3], answer_params()[:1])
        finally:
            await other.close()
        await engine.continue_branches([branch.handle], "x", [BranchParams()])

    with pytest.raises(ValueError, match="handles must come from this engine"):
        run(url, tok, mixed)


def test_pipeline_short_path_through_sglang(runtime, tok, checker):
    stub, url = runtime
    result = run(
        url,
        tok,
        lambda e: RewardPipeline(e, HeuristicScorer(), checker).score_item(ITEM, options(return_samples=True)),
    )
    assert result.route is Route.SHORT and result.answer == "Yes" and result.reward == 1.0 and result.error is None
    assert result.consensus == 1.0 and [s.text for s in result.samples] == ["42"] * 5
    assert result.judgements[0].by is VerdictBy.EQUIVALENCE
    prompt = len(tok.encode(tok.render_chat(JUDGE.messages(ITEM))))
    # Computed prompt tokens: the prefix once, plus the one token each other branch recomputes.
    computed = result.usage.prompt_tokens - result.usage.cached_prompt_tokens
    assert computed == prompt + 4
    assert len(stub.requests) == 2  # warm-up, the five answers; the verifier compared "42" with "42"


def test_pipeline_long_path_through_sglang(runtime, tok, checker):
    stub, url = runtime
    stub.answers = split("42", "41")  # 3 of 5 say 42: consensus 0.6 < tau
    result = run(url, tok, lambda e: RewardPipeline(e, HeuristicScorer(), checker).score_item(ITEM, options()))
    assert result.route is Route.LONG and result.consensus == 0.6 and result.error is None
    # Every candidate's reasoning reaches 42, the response's number: right, by equivalence.
    assert [c.answer for c in result.candidates] == ["42"] * 5 and (result.answer, result.reward) == ("Yes", 1.0)
    warm, batch, reasoning = stub.requests  # one call per stage, M branches in each
    assert len(reasoning["input_ids"]) == 5
    assert all("regex" not in p and "stop" not in p for p in reasoning["sampling_params"])
    # Each reasoning prompt extends its own branch with the cue: the whole context continues.
    cue = tok.encode(JUDGE.reasoning_cue)
    assert all(r[-len(cue) :] == cue for r in reasoning["input_ids"])


def test_a_response_without_a_number_gets_the_verdict_from_the_runtime(runtime, tok, checker):
    stub, url = runtime
    item = JudgeItem(prompt="What is 12 + 30?", response="XLII")
    stub.answers = lambda i, params: " Yes" if params.get("regex") else "42"
    result = run(url, tok, lambda e: RewardPipeline(e, HeuristicScorer(), checker).score_item(item, options()))
    assert result.route is Route.SHORT and result.judgements[0].by is VerdictBy.JUDGE and result.answer == "Yes"
    warm, batch, final = stub.requests
    assert final["sampling_params"][0]["regex"] == " ?(Yes|No)" and final["sampling_params"][0]["temperature"] == 0


def test_ready_and_model_name_come_from_the_runtime(runtime, tok):
    stub, url = runtime

    async def probe(engine):
        before = engine.model_name
        up = await engine.ready()
        stub.healthy = False
        return before, up, engine.model_name, await engine.ready()

    before, up, name, down = run(url, tok, probe)
    assert before == "SmolLM2-135M-Instruct" and up and name == stub.model_path and not down


@pytest.mark.parametrize(
    "paths", [("/server_info", "/get_server_info"), ("/get_server_info",)], ids=["runtime", "through-the-router"]
)
def test_a_runtime_that_answers_without_text_is_refused_at_the_readiness_check(tok, caplog, paths):
    stub = StubRuntime(tok, skip_tokenizer_init=True, server_info_paths=paths)

    async def probe(engine):
        ready = await engine.ready()
        with pytest.raises(EngineUnavailableError) as caught:
            await engine.sample([1, 2, 3], answer_params())
        return ready, await engine.ready(), str(caught.value)

    with serve(stub.app()) as url:
        ready, again, message = run(url, tok, probe)
    assert not ready and not again and "--skip-tokenizer-init" in message and url in message
    assert stub.requests == []  # refused before any /generate
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [message]  # said once


def test_a_runtime_that_does_not_tell_its_server_args_is_taken_as_it_is(tok):
    stub = StubRuntime(tok, server_info_paths=())  # neither name answers

    async def use(engine):
        return await engine.ready(), await engine.sample([1, 2, 3], answer_params()[:1])

    with serve(stub.app()) as url:
        ready, branches = run(url, tok, use)
    assert ready and len(branches) == 1


def test_api_key_is_sent_as_bearer(runtime, tok):
    stub, url = runtime
    run(url, tok, lambda e: e.sample([1, 2, 3], answer_params()[:1]), api_key="k3y")
    assert stub.authorizations == ["Bearer k3y", "Bearer k3y"]


def test_unreachable_runtime_is_unavailable_and_not_ready(tok):
    url = f"http://user:s3cret@127.0.0.1:{free_port()}"

    async def try_it(engine):
        ready = await engine.ready()
        with pytest.raises(EngineUnavailableError) as caught:
            await engine.sample([1, 2, 3], answer_params())
        return ready, str(caught.value)

    ready, message = run(url, tok, try_it)
    assert not ready and "unreachable" in message and "127.0.0.1" in message and "s3cret" not in message


@pytest.mark.parametrize(
    ("status", "body", "media", "error", "words"),
    [
        (500, b"Internal Server Error", "text/plain", EngineUnavailableError, "HTTP 500: Internal Server Error"),
        (200, b"<html>not json", "text/html", EngineUnavailableError, "not JSON"),
        (200, b'[{"text": "Yes"}]', "application/json", EngineUnavailableError, "malformed"),
        (200, b"[]", "application/json", EngineUnavailableError, "malformed"),
        (400, b'{"error": {"message": "The input is too long"}}', "application/json", BackendRejectedError, "too long"),
        (
            200,
            b'{"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "out of memory"}}}',
            "application/json",
            BackendRejectedError,
            "aborted a branch: out of memory",
        ),
    ],
)
def test_runtime_failures_are_clear_errors(runtime, tok, status, body, media, error, words):
    stub, url = runtime
    stub.failures += [
        (
            200,
            b'{"text": "", "meta_info": {"finish_reason": {"type": "length", "length": 0}, "prompt_tokens": 3}}',
            "application/json",
        ),
        (status, body, media),
    ]
    with pytest.raises(error, match=re.escape(words)) as caught:
        run(url, tok, lambda e: e.sample([1, 2, 3], answer_params()))
    assert url.removeprefix("http://") in str(caught.value)


@pytest.mark.parametrize("checked_by", ["engine", "runtime"])
def test_a_prompt_too_long_fails_that_item_only(runtime, tok, checker, checked_by):
    """Refused locally from the model config, or by the runtime (HTTP 400) when the folder has none."""
    stub, url = runtime
    engine_tok = tok if checked_by == "engine" else dataclasses.replace(tok, context_length=None)
    long_item = JudgeItem(prompt="x " * 9000, response="y")  # past the model's 8k context
    results = run(
        url,
        engine_tok,
        lambda e: RewardPipeline(e, HeuristicScorer(), checker).score([ITEM, long_item], options(path=PathMode.SHORT)),
    )
    assert results[0].error is None and results[0].answer == "Yes"
    assert results[1].reward is None and "context" in results[1].error
    assert ("rejected the input (HTTP 400)" in results[1].error) == (checked_by == "runtime")
