"""egrm in front of a real vLLM server (its CPU build, installed by `make vllm`), serving the judge egrm
serves: the production path, live, as llama.cpp's is in test_llamacpp_live.py.

Everything here is real: vLLM's OpenAI-compatible server and its engine processes on a loopback
port, egrm's uvicorn, HTTP between them. vLLM runs in float32, the arithmetic of the embedded
engine these tests compare it with. What a real vLLM cannot be made to do (answer 429 or 500, send
a malformed body, be a release older than 0.12, check an API key without a second start) stays
with the stand-in in test_openai.py. The last test kills the server: keep it last.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from egrm.config import Settings
from egrm.engines.base import BranchParams, SpareTag, WorkTag
from egrm.engines.embedded.fetch import GEMMA3_270M, fetch_model
from egrm.engines.openai import OpenAIEngine
from egrm.main import create_app
from loadtest.serverproc import free_port, vllm_server
from tests.live import serve, wait_for

pytestmark = pytest.mark.slow

ALIAS = "smollm2-judge"
SLOTS = 8  # the most sequences vLLM runs at once here
RIGHT = {"prompt": "What is 12 + 30?", "response": "42"}
WRONG = {"prompt": "What is 12 + 30?", "response": "41"}


@pytest.fixture(scope="module")
def vllm(model_path: Path) -> Iterator[tuple[str, int]]:
    """(base URL, process group id) of vLLM serving the judge."""
    port = free_port()
    # Eager: ready in about 30 s instead of two minutes of compiling (what is tested is the same).
    # Scheduled by request priority (as docs/engines.md starts it), with room for SLOTS sequences.
    args = ["--max-num-seqs", str(SLOTS)]
    with vllm_server(
        model_path, Settings().cache_dir, port, served_name=ALIAS, dtype="float32", eager=True, args=args
    ) as proc:
        yield f"http://127.0.0.1:{port}", proc.pid


def on_vllm(model_path: Path, url: str, **overrides) -> Settings:
    return Settings(model=str(model_path), engine="openai", openai_url=f"{url}/v1", openai_dialect="vllm", **overrides)


@pytest.fixture(scope="module")
def egrm(vllm, model_path: Path) -> Iterator[str]:
    with serve(create_app(on_vllm(model_path, vllm[0]))) as url:
        yield url


def rewards(url: str, items: list[dict], timeout: float = 120, **options) -> httpx.Response:
    return httpx.post(f"{url}/v1/rewards", json={"items": items, "options": options}, timeout=timeout)


def vllm_metric(url: str, name: str, **labels: str) -> float:
    """The sum of a vLLM series over every label set that has `labels` (0 when absent)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.split()[-1])
    return total


def vllm_requests(url: str) -> float:
    """Requests vLLM has finished, whatever their reason (stop, length, abort, error)."""
    return vllm_metric(url, "vllm:request_success_total")


def test_rewards_on_the_short_and_the_long_path(egrm, vllm):
    url = vllm[0]
    assert httpx.get(f"{egrm}/readyz").json() == {"ready": True, "engine": True, "scorer": True, "store": "in-process"}
    hits = vllm_metric(url, "vllm:prefix_cache_hits_total")
    short = rewards(egrm, [RIGHT, WRONG], path="short", seed=3)
    long = rewards(egrm, [RIGHT, WRONG], path="long", seed=3)
    assert short.status_code == 200 and long.status_code == 200, (short.text, long.text)
    assert short.json()["model"] == ALIAS  # the first model vLLM lists: its --served-model-name
    for body, route in ((short.json(), "short"), (long.json(), "long")):
        right, wrong = body["results"]
        assert right["route"] == wrong["route"] == route and right["error"] is None
        assert right["reward"] > wrong["reward"] and wrong["verdict"] == "No", (route, right, wrong)
    # Every candidate, or (early stop) the first alone where the scorer accepted it.
    for c in (r["candidates"] for r in long.json()["results"]):
        assert len(c) == 5 or (len(c) == 1 and c[0]["score"] >= 0.9), c
    # The long path continues each sample from its whole context: vLLM's prefix cache serves the
    # judge prompt's full 32-token blocks, and says so in usage (--enable-prompt-tokens-details).
    usage = long.json()["usage"]
    assert 0 < usage["cached_prompt_tokens"] < usage["prompt_tokens"]
    assert vllm_metric(url, "vllm:prefix_cache_hits_total") - hits >= usage["cached_prompt_tokens"]


def test_answers_are_constrained_and_their_logprobs_are_the_embedded_engines(vllm, tok, engine):
    """Structured outputs hold a branch to the allowed answers, and vLLM's log-probs (read from the
    masked logits) are renormalised over them: the embedded engine's, in the same arithmetic."""
    question = engine.encode_chat([{"role": "user", "content": "What is 7 * 8? Answer with the number."}])
    follow = engine.encode_chat([{"role": "user", "content": "Is 7 * 8 = 56? Answer Yes or No."}])
    greedy = [BranchParams(temperature=0.0, max_new_tokens=12)]
    verdict = [BranchParams(temperature=0.0, max_new_tokens=4, allowed=("Yes", "No"))]
    sampled = [BranchParams(temperature=1.0, max_new_tokens=4, allowed=("Yes", "No"), seed=s) for s in range(8)]

    async def both() -> tuple[list, ...]:
        remote = OpenAIEngine(tok, f"{vllm[0]}/v1", dialect="vllm")
        try:
            theirs = [await remote.sample(question, greedy), await remote.sample(follow, verdict)]
            mine = [await engine.sample(question, greedy), await engine.sample(follow, verdict)]
            return (*theirs, *mine, await remote.sample(follow, sampled))
        finally:
            await remote.close()

    their_answer, their_verdict, my_answer, my_verdict, at_t1 = asyncio.run(both())
    assert their_answer[0].text == my_answer[0].text and their_answer[0].token_ids == my_answer[0].token_ids
    assert {b.text.strip() for b in at_t1} <= {"Yes", "No"} and their_verdict[0].text.strip() in {"Yes", "No"}
    # The free answer's probability at T=1 (what the exact estimator reads), and the verdict's
    # within Yes/No: both as the embedded engine computes them.
    for theirs, mine in ((their_answer, my_answer), (their_verdict, my_verdict)):
        assert math.exp(sum(theirs[0].logprobs)) == pytest.approx(math.exp(sum(mine[0].logprobs)), abs=0.02)
    assert math.exp(sum(their_verdict[0].logprobs)) >= 0.5  # greedy between two: at least half


def test_vllm_starts_live_work_before_spare_and_background_work(vllm, tok):
    """With every slot taken, work that waits is started by its rank: a live call sent after a
    spare one (the long path's candidates beyond its first) and a background one (a question's
    work in its grace, nobody waiting) gets the first slot that frees, the spare one the next, the
    background one the last. Under fcfs they would finish in the order they were sent."""
    url, _ = vllm
    ids = tok.encode("Once upon a time")

    def tokens(n: int) -> list[BranchParams]:
        return [BranchParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)]

    async def race() -> list[str]:
        remote = OpenAIEngine(tok, f"{url}/v1", dialect="vllm")
        finished: list[str] = []

        async def one(name: str, tag: object) -> None:
            await remote.sample(ids, tokens(24), tag=tag)
            finished.append(name)

        try:
            # Every slot taken, the slots freeing one at a time, 8 tokens apart.
            blockers = [asyncio.ensure_future(remote.sample(ids, tokens(24 + 8 * i))) for i in range(SLOTS)]
            assert await asyncio.to_thread(wait_for, lambda: vllm_metric(url, "vllm:num_requests_running") == SLOTS, 30)
            waiting = []
            for name, tag in [
                ("background", WorkTag("r1", lambda: False)),
                ("spare", SpareTag("r2", lambda: False)),
                ("live", "r3"),
            ]:
                waiting.append(asyncio.ensure_future(one(name, tag)))
                await asyncio.sleep(0.1)  # each arrives after the one before
            # vLLM's gauges move when its engine reports a step (one step of SLOTS rows is slow on a
            # CPU): read once, they can still show the third caller outside the queue.
            assert await asyncio.to_thread(wait_for, lambda: vllm_metric(url, "vllm:num_requests_waiting") == 3, 10)
            await asyncio.gather(*blockers, *waiting)
        finally:
            await remote.close()
        return finished

    assert asyncio.run(race()) == ["live", "spare", "background"]


def test_the_exact_estimator_and_a_free_text_response(egrm):
    item = {"prompt": "What is 17 * 3?", "response": "LI"}  # no number it reads: the judge's Yes/No decides
    r = rewards(egrm, [item], path="short", consensus="exact", seed=2)
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    assert 0 < result["exact_consensus"] <= 1 and result["consensus"] == result["exact_consensus"]
    assert result["verdict_by"] == "judge" and result["answer"] in ("Yes", "No")
    assert 0 <= result["reward"] <= 1 and result["error"] is None


def test_seeds_reproduce_and_differ(vllm, model_path):
    """With question sharing off, so that every request samples anew on vLLM."""
    hard = [{"prompt": "What is 47 * 38?", "response": "1786"}]
    with serve(create_app(on_vllm(model_path, vllm[0], share_questions=False))) as url:

        def samples(seed: int) -> list[str]:
            r = rewards(url, hard, path="short", seed=seed, return_samples=True)
            assert r.status_code == 200, r.text
            return [s["text"] for s in r.json()["results"][0]["samples"]]

        first, again, others = samples(11), samples(11), [samples(s) for s in (12, 13, 14)]
    assert first == again and len(first) == 5
    assert any(other != first for other in others)


def test_a_group_costs_one_questions_calls(vllm, model_path):
    """Eight responses to one question: five vLLM calls (the ladder), not forty; off, forty."""
    group = [{"prompt": "What is 23 + 19?", "response": r} for r in ("42", "The answer is 42.", "41", "**41**")] * 2
    calls = {}
    for share in (True, False):
        with serve(create_app(on_vllm(model_path, vllm[0], share_questions=share))) as url:
            before = vllm_requests(vllm[0])
            r = rewards(url, group, path="short", seed=21)
            assert r.status_code == 200 and all(x["error"] is None for x in r.json()["results"]), r.text
            calls[share] = vllm_requests(vllm[0]) - before
            by_answer = {x["judgements"][0]["response_answer"]: set() for x in r.json()["results"]}
            for x in r.json()["results"]:
                by_answer[x["judgements"][0]["response_answer"]].add(x["reward"])
            if share:
                assert all(len(v) == 1 for v in by_answer.values()), by_answer  # one reward per answer
    assert calls == {True: 5, False: 40}


def test_a_deadline_aborts_vllms_work(vllm, model_path):
    """No grace after the deadline: the request's calls are cancelled, and vLLM drops their work
    (it aborts a request whose client has gone)."""
    url = vllm[0]
    items = [{"prompt": f"What is {a} * {a + 7}?", "response": "1"} for a in range(31, 47)]
    settings = on_vllm(model_path, url, request_timeout_s=4, share_grace_s=0, long_max_tokens=512)
    with serve(create_app(settings)) as egrm, ThreadPoolExecutor(1) as pool:
        # 16 questions x 8 branches, reasoning up to 512 tokens each: far more than 4 s of work here.
        call = pool.submit(rewards, egrm, items, path="long", m=8)
        assert wait_for(lambda: vllm_metric(url, "vllm:num_requests_running") > 0, 30)
        r = call.result()
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error", r.text

    def idle() -> bool:
        return vllm_metric(url, "vllm:num_requests_running") + vllm_metric(url, "vllm:num_requests_waiting") == 0

    assert wait_for(idle, 10)
    generated = vllm_metric(url, "vllm:generation_tokens_total")
    time.sleep(1)
    assert vllm_metric(url, "vllm:generation_tokens_total") == generated  # nothing decodes any more


def test_a_stalled_vllm_is_504_and_the_retry_loses_nothing(vllm, model_path):
    """vLLM stopped (SIGSTOP: it holds its connections and answers nothing): the deadline answers
    504 with Retry-After; the question's work goes on for the grace, and once vLLM resumes the
    retry collects it."""
    url, group = vllm
    item = {"prompt": "What is 29 + 14?", "response": "43"}
    with serve(create_app(on_vllm(model_path, url, request_timeout_s=3, share_grace_s=60))) as egrm:
        os.killpg(group, signal.SIGSTOP)
        try:
            stalled = rewards(egrm, [item], path="short", seed=8)
        finally:
            os.killpg(group, signal.SIGCONT)
        assert stalled.status_code == 504 and stalled.headers["retry-after"] == "1", stalled.text
        retry = rewards(egrm, [item], path="short", seed=8)
    assert retry.status_code == 200, retry.text
    (result,) = retry.json()["results"]
    assert result["error"] is None and result["reward"] is not None
    assert result["shared"] in ("joined", "cached")  # the stalled request's work, not a new one


def test_a_tokenizer_other_than_the_served_models_is_refused(vllm, tok):
    """egrm sends token ids, so EGRM_MODEL must tokenize as the served model does: readiness asks
    vLLM's /tokenize once. Another family's tokenizer (Gemma 3's, against the judge vLLM serves) is
    not ready, and a request is a 503 that says why, before any id is sent."""
    gemma = fetch_model(Settings().cache_dir, GEMMA3_270M)  # `make test` fetched it (`make gemma`)
    with serve(create_app(on_vllm(gemma, vllm[0], chat_template="gemma"))) as url:
        assert wait_for(lambda: httpx.get(f"{url}/readyz", timeout=10).status_code == 503, 15)
        before = vllm_requests(vllm[0])
        r = rewards(url, [RIGHT], path="short")
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "tokenizes text otherwise than EGRM_MODEL's tokenizer" in message and "gemma" in message.lower()
    assert vllm_requests(vllm[0]) == before  # nothing was sent

    async def matching() -> bool:  # the judge's own tokenizer passes the same check
        remote = OpenAIEngine(tok, f"{vllm[0]}/v1", dialect="vllm")
        try:
            return await remote.ready()
        finally:
            await remote.close()

    assert asyncio.run(matching())


def test_vllm_gone_is_503_and_not_ready(vllm, egrm):
    """Last: it kills the module's vLLM."""
    url, group = vllm

    async def killed_mid_request() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as client:
            call = asyncio.ensure_future(
                client.post(f"{egrm}/v1/rewards", json={"items": [RIGHT] * 8, "options": {"path": "long", "m": 8}})
            )
            await asyncio.sleep(0.5)  # the calls are under way on vLLM
            os.killpg(group, signal.SIGKILL)
            return await call

    r = asyncio.run(killed_mid_request())
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "engine_unavailable" and url in r.json()["error"]["message"]
    assert wait_for(lambda: httpx.get(f"{egrm}/readyz").status_code == 503)
    assert httpx.get(f"{egrm}/readyz").json()["engine"] is False
