"""egrm in front of a real llama.cpp `llama-server` (built by `make llama-server`), serving the judge
egrm serves converted to one GGUF (`make llama-judge`): the same model, the same template.

Everything here is real: the server process on a loopback port, egrm's uvicorn, HTTP between them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from egrm.config import Settings
from egrm.engines.base import BranchParams
from egrm.engines.embedded.fetch import GEMMA3_270M, fetch_model
from egrm.engines.llamacpp import LlamaCppEngine
from egrm.llamacpp_local import judge_gguf
from egrm.main import create_app
from loadtest.serverproc import free_port, llama_server
from tests.live import serve, wait_for

pytestmark = pytest.mark.slow

ALIAS = "smollm2-judge"
RIGHT = {"prompt": "What is 12 + 30?", "response": "42"}
WRONG = {"prompt": "What is 12 + 30?", "response": "41"}


@pytest.fixture(scope="module")
def gguf(model_path: Path) -> Path:
    return judge_gguf(Settings(), "f32")


@pytest.fixture(scope="module")
def llama(gguf: Path) -> Iterator[str]:
    port = free_port()
    with llama_server(gguf, Settings().cache_dir, port, alias=ALIAS):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def egrm(llama: str, base_model_path: Path) -> Iterator[str]:
    settings = Settings(model=str(base_model_path), engine="llamacpp", llamacpp_url=llama)
    with serve(create_app(settings)) as url:
        yield url


def rewards(url: str, items: list[dict], **options) -> httpx.Response:
    return httpx.post(f"{url}/v1/rewards", json={"items": items, "options": options}, timeout=120)


def test_rewards_on_the_short_and_the_long_path(egrm):
    assert httpx.get(f"{egrm}/readyz").json() == {"ready": True, "engine": True, "scorer": True, "store": "in-process"}
    short = rewards(egrm, [RIGHT, WRONG], path="short", seed=3)
    long = rewards(egrm, [RIGHT, WRONG], path="long", seed=3)
    assert short.status_code == 200 and long.status_code == 200, (short.text, long.text)
    assert short.json()["model"] == ALIAS  # the server's own name for its model
    for body, route in ((short.json(), "short"), (long.json(), "long")):
        right, wrong = body["results"]
        assert right["route"] == wrong["route"] == route and right["error"] is None
        assert right["reward"] > wrong["reward"], (route, right, wrong)
        assert wrong["verdict"] == "No"
    # Every candidate, or (early stop) the first alone where the scorer accepted it.
    for c in (r["candidates"] for r in long.json()["results"]):
        assert len(c) == 5 or (len(c) == 1 and c[0]["score"] >= 0.9), c
    # The long path continues each sample: the server reuses the cached prompt for each.
    assert long.json()["usage"]["cached_prompt_tokens"] > 0


def test_the_openai_engine_against_a_real_openai_compatible_server(llama, base_model_path):
    """llama-server's /v1 is an OpenAI-compatible server: the `openai` engine meets a real one here
    (standard fields only; answers read from free text)."""
    # Question sharing off: the repeated request goes to the server again, not to egrm's window.
    settings = Settings(model=str(base_model_path), engine="openai", openai_url=f"{llama}/v1", share_questions=False)
    with serve(create_app(settings)) as url:
        first = rewards(url, [RIGHT, WRONG], path="short", seed=5)
        again = rewards(url, [RIGHT, WRONG], path="short", seed=5)
    assert first.status_code == 200, first.text
    right, wrong = first.json()["results"]
    assert first.json()["model"] == ALIAS  # the first model /v1/models lists
    assert right["reward"] > wrong["reward"] and right["error"] is None and wrong["verdict"] == "No"
    # usage.prompt_tokens_details.cached_tokens reaches usage: a repeated request's prompts are
    # partly served from the slots' cache (how much depends on which slots its calls land on).
    usage = again.json()["usage"]
    assert 0 < usage["cached_prompt_tokens"] < usage["prompt_tokens"]


def test_chat_completions_through_egrm(egrm):
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    r = httpx.post(f"{egrm}/v1/chat/completions", json={"model": "egrm", "messages": messages, "seed": 1}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == body["egrm"]["answer"] == "Yes"
    assert body["usage"]["prompt_tokens"] > 0 and body["model"] == ALIAS


def test_seeds_reproduce_and_differ(llama, base_model_path):
    """Question sharing off, so that every request samples anew on the server."""
    settings = Settings(model=str(base_model_path), engine="llamacpp", llamacpp_url=llama, share_questions=False)
    with serve(create_app(settings)) as url:
        one = rewards(url, [RIGHT], path="short", seed=11, return_samples=True).json()["results"][0]
        again = rewards(url, [RIGHT], path="short", seed=11, return_samples=True).json()["results"][0]
        hard = [{"prompt": "What is 47 * 38?", "response": "1786"}]  # where the judge's samples scatter
        seeds = [rewards(url, hard, path="short", seed=s, return_samples=True).json() for s in (11, 12, 13, 14)]
    assert one["samples"] == again["samples"] and one["reward"] == again["reward"] and again["shared"] is None
    assert len(one["samples"]) == 5
    assert len({str(s["results"][0]["samples"]) for s in seeds}) > 1


def test_a_repeated_prompt_is_served_from_the_servers_cache(llama, tok):
    async def twice() -> tuple[list, list]:
        engine = LlamaCppEngine(tok, llama)
        ids = engine.encode_chat([{"role": "user", "content": "Name a colour. " + "Think of the sea. " * 20}])
        params = [BranchParams(temperature=0.8, max_new_tokens=4, seed=5 + i) for i in range(3)]
        try:
            return await engine.sample(ids, params), await engine.sample(ids, params)
        finally:
            await engine.close()

    first, second = asyncio.run(twice())
    # One n_cmpl call each: the first computes the prompt once for all three branches.
    prompt = first[0].prompt_tokens
    assert prompt > 100 and first[0].cached_prompt_tokens < prompt // 2
    assert [b.cached_prompt_tokens for b in first[1:]] == [prompt, prompt]
    assert second[0].cached_prompt_tokens >= prompt - 1  # the server re-evaluates at least one token


def test_greedy_agrees_with_the_embedded_engine_and_verdicts_are_renormalised(llama, tok, engine):
    question = engine.encode_chat([{"role": "user", "content": "What is 7 * 8? Answer with the number."}])
    greedy = [BranchParams(temperature=0.0, max_new_tokens=12)]
    verdict = [BranchParams(temperature=0.0, max_new_tokens=4, allowed=("Yes", "No"))]
    follow = engine.encode_chat([{"role": "user", "content": "Is 7 * 8 = 56? Answer Yes or No."}])

    async def both() -> tuple[list, list, list, list]:
        remote = LlamaCppEngine(tok, llama)
        try:
            mine = await engine.sample(question, greedy)
            theirs = await remote.sample(question, greedy)
            return mine, theirs, await engine.sample(follow, verdict), await remote.sample(follow, verdict)
        finally:
            await remote.close()

    mine, theirs, my_verdict, their_verdict = asyncio.run(both())
    assert theirs[0].text == mine[0].text  # one model, one template, f32 weights on both sides
    assert their_verdict[0].text == my_verdict[0].text and their_verdict[0].token_ids == my_verdict[0].token_ids
    # Greedy between two answers, renormalised over them: the chosen one has at least half.
    p_remote, p_local = (math.exp(sum(v[0].logprobs)) for v in (their_verdict, my_verdict))
    assert 0.5 <= p_remote <= 1.0
    assert p_remote == pytest.approx(p_local, abs=0.02)


def test_a_tokenizer_other_than_the_served_models_is_refused(llama):
    """egrm sends llama-server token ids: readiness asks its /tokenize once. Gemma 3's tokenizer
    against the judge it serves is not ready, and a request is a 503 that says why."""
    gemma = fetch_model(Settings().cache_dir, GEMMA3_270M)  # `make test` fetched it (`make gemma`)
    settings = Settings(model=str(gemma), engine="llamacpp", llamacpp_url=llama, chat_template="gemma")
    with serve(create_app(settings)) as url:
        assert wait_for(lambda: httpx.get(f"{url}/readyz", timeout=10).status_code == 503, 15)
        r = rewards(url, [RIGHT], path="short")
    assert r.status_code == 503, r.text
    assert "tokenizes text otherwise than EGRM_MODEL's tokenizer" in r.json()["error"]["message"]


def test_a_killed_server_is_503_and_not_ready_then_recovers(gguf, base_model_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = Settings(model=str(base_model_path), engine="llamacpp", llamacpp_url=url)
    with serve(create_app(settings)) as egrm:
        with llama_server(gguf, Settings().cache_dir, port, alias=ALIAS) as proc:
            assert rewards(egrm, [RIGHT], path="short").status_code == 200

            async def killed_mid_request() -> httpx.Response:
                async with httpx.AsyncClient(timeout=60) as client:
                    call = asyncio.ensure_future(
                        client.post(f"{egrm}/v1/rewards", json={"items": [RIGHT] * 8, "options": {"path": "long"}})
                    )
                    await asyncio.sleep(1.0)  # the long path is under way on the server
                    proc.kill()
                    return await call

            r = asyncio.run(killed_mid_request())
        assert r.status_code == 503, r.text
        assert r.json()["error"]["type"] == "engine_unavailable" and url in r.json()["error"]["message"]
        assert wait_for(lambda: httpx.get(f"{egrm}/readyz").status_code == 503)
        with llama_server(gguf, Settings().cache_dir, port, alias=ALIAS):
            assert wait_for(lambda: httpx.get(f"{egrm}/readyz").status_code == 200)
            again = rewards(egrm, [RIGHT], path="short")
    assert again.status_code == 200 and again.json()["results"][0]["error"] is None
