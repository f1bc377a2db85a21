"""POST /get_reward as OpenRLHF's trainer calls it, over real HTTP.

The requests replay OpenRLHF's remote_rm_fn (openrlhf/utils/remote_rm_utils.py): a JSON POST of
{"query": [...], "prompts": [...], "labels": [...]}, where each query is the policy's prompt (chat
template applied) followed by the decoded response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from egrm.config import Settings
from egrm.main import create_app
from tests.live import metric, serve

pytestmark = pytest.mark.slow

# What a ChatML policy's rollout decodes to (skip_special_tokens=False keeps the markers).
PROMPTS = [
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
]
RESPONSES = ["4<|im_end|>", "Berlin<|im_end|>"]
QUERIES = [p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)]


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serve(create_app(Settings(max_items=4), engine=engine)) as base:
        yield base


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/get_reward", json=body, headers={"Content-Type": "application/json"}, timeout=180)


def test_openrlhf_request_gets_rewards_scores_and_extra_logs(url):
    r = post(url, {"query": QUERIES, "prompts": PROMPTS, "labels": ["4", "Paris"], "egrm": {"path": "short"}})
    assert r.status_code == 200, r.text
    data = r.json()
    assert len(data["rewards"]) == 2 and all(0.0 <= x <= 1.0 for x in data["rewards"])
    assert data["rewards"][0] == 1.0  # the label "4" reads as a number: it decides, against "4"
    assert data["scores"] == data["rewards"]
    assert set(data["extra_logs"]) == {"egrm_consensus", "egrm_verdict", "egrm_long_route", "egrm_shared"}
    assert data["extra_logs"]["egrm_verdict"][0] == 1.0
    assert data["extra_logs"]["egrm_long_route"] == [0.0, 0.0]
    assert all(0.2 <= c <= 1.0 for c in data["extra_logs"]["egrm_consensus"])
    # One item decided by its label (route "reference"), the other by the judge: a mixed request.
    assert metric(url, 'egrm_request_latency_seconds_count{endpoint="/get_reward",route="mixed"}') >= 1


def test_long_route_is_logged_per_query(url):
    r = post(url, {"query": QUERIES[:1], "prompts": PROMPTS[:1], "egrm": {"path": "long", "m": 2, "seed": 1}})
    assert r.status_code == 200, r.text
    assert r.json()["extra_logs"]["egrm_long_route"] == [1.0]


def test_labels_reach_the_judge_as_the_reference(url):
    series = "egrm_prompt_tokens_total"
    before = metric(url, series)
    options = {"path": "short", "seed": 3}  # the same sampled answer both times (see below)
    assert post(url, {"query": QUERIES[:1], "prompts": PROMPTS[:1], "egrm": options}).status_code == 200
    plain = metric(url, series) - before
    # A label that does not read as a number is shown to the judge: a longer prompt.
    before = metric(url, series)
    body = {"query": QUERIES[:1], "prompts": PROMPTS[:1], "labels": ["the sum of two pairs"], "egrm": options}
    assert post(url, body).status_code == 200
    assert metric(url, series) - before > plain
    # One that does decides by itself, with no model call, right or wrong.
    before = metric(url, series)
    body = {"query": QUERIES[:1] * 2, "prompts": PROMPTS[:1] * 2, "labels": [4, "5"], "egrm": options}
    r = post(url, body)
    assert r.json()["rewards"] == [1.0, 0.0] and metric(url, series) == before


def test_the_policys_end_of_sequence_and_padding_are_not_the_response(url):
    from egrm.chat_text import without_end_markers

    assert without_end_markers("4<|im_end|>\n<|endoftext|><pad><pad>") == "4"
    assert without_end_markers("x</s>") == "x" and without_end_markers("a<|im_end|>b") == "a<|im_end|>b"
    query = PROMPTS[0] + "The answer is 4.<|eot_id|><|end_of_text|>[PAD][PAD]"
    body = {"query": [query], "prompts": PROMPTS[:1], "labels": ["4"]}
    assert post(url, body).json()["rewards"] == [1.0]


def test_without_prompts_a_chat_query_is_read_as_turns(url):
    # Seeded: the same samples each time, so equal judge prompts count equal prompt tokens.
    options = {"path": "short", "seed": 3}
    series = "egrm_prompt_tokens_total"
    before = metric(url, series)
    r = post(url, {"query": QUERIES[:1], "egrm": options})  # OpenRLHF's older remote_rm_fn: no prompts
    assert r.status_code == 200 and len(r.json()["rewards"]) == 1
    alone = metric(url, series) - before
    before = metric(url, series)
    assert post(url, {"query": QUERIES[:1], "prompts": PROMPTS[:1], "egrm": options}).json() == r.json()
    assert metric(url, series) - before == alone


CHATML = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
)
LLAMA3 = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{q}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
)
ASKED = [("What is 7+8?", "15"), ("What is 9*6?", "The answer is 53."), ("What is 13-5?", "13 - 5 = 8")]


@pytest.mark.parametrize(("template", "eos"), [(CHATML, "<|im_end|>"), (LLAMA3, "<|eot_id|><|end_of_text|>")])
def test_the_policys_chat_template_is_not_the_question(url, template, eos):
    """Wrapped in the policy's chat markup (ChatML, Llama 3), with or without prompts, or with the
    query's head cut off by the trainer: the judge reads the question and the response alone, so
    each reward is the plain item's on /v1/rewards, with the same seed."""
    options = {"path": "short", "seed": 4}
    plain = [{"prompt": q, "response": r} for q, r in ASKED]
    expected = httpx.post(f"{url}/v1/rewards", json={"items": plain, "options": options}, timeout=180).json()
    rewards = [r["reward"] for r in expected["results"]]
    assert rewards[1] < rewards[0]  # 53 is wrong, 15 right
    prompts = [template.format(q=q) for q, _ in ASKED]
    queries = [p + r + eos for p, (_, r) in zip(prompts, ASKED, strict=True)]
    for body in (
        {"query": queries, "prompts": prompts},
        {"query": queries},
        {"query": [q[40:] for q in queries], "prompts": prompts},  # left-truncated queries
    ):
        r = post(url, {**body, "egrm": options})
        assert r.status_code == 200 and r.json()["rewards"] == rewards, (body, r.text)
    wrapped = [{"prompt": p, "response": r + eos} for p, (_, r) in zip(prompts, ASKED, strict=True)]
    again = httpx.post(f"{url}/v1/rewards", json={"items": wrapped, "options": options}, timeout=180).json()
    assert [r["reward"] for r in again["results"]] == rewards


def test_empty_lists_answer_empty_lists(url):
    """OpenRLHF with several reward URLs posts one query to the first and empty lists to the others;
    any error there fails the whole reward fetch."""
    r = post(url, {"query": [], "prompts": [], "labels": []})
    assert r.status_code == 200, r.text
    empty = {"egrm_consensus": [], "egrm_verdict": [], "egrm_long_route": [], "egrm_shared": []}
    assert r.json() == {"rewards": [], "scores": [], "extra_logs": empty}


def test_unknown_keys_from_forks_are_ignored(url):
    body = {"query": QUERIES[:1], "prompts": PROMPTS[:1], "labels": [None], "datasources": ["math"]}
    assert post(url, {**body, "egrm": {"path": "short"}}).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"query": QUERIES, "prompts": PROMPTS[:1]}, 422, "prompts"),
        ({"query": QUERIES, "prompts": PROMPTS, "labels": ["4"]}, 422, "labels"),
        ({"prompts": PROMPTS}, 422, "query"),
        ({"query": [1, 2]}, 422, "query[0]"),
        ({"query": QUERIES * 3, "prompts": PROMPTS * 3}, 413, "query"),
        ({"query": QUERIES, "egrm": {"tau": 2}}, 422, "egrm.tau"),
        ({"query": QUERIES, "egrm": {"template": "pairwise"}}, 422, "egrm.template"),
    ],
)
def test_bad_requests_name_the_field(url, body, status, param):
    r = post(url, body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_a_query_over_the_token_limit_is_named(engine):
    with serve(create_app(Settings(max_prompt_tokens=80), engine=engine)) as base:
        r = post(base, {"query": ["short", "word " * 200]})
    assert r.status_code == 413 and r.json()["error"]["param"] == "query[1]"


def test_an_item_the_model_cannot_judge_fails_the_request_naming_it(engine):
    # OpenRLHF makes a tensor of the rewards: no hole may be left, so the request fails, naming the query.
    with serve(create_app(Settings(max_prompt_tokens=100_000), engine=engine)) as base:
        r = post(base, {"query": ["4", "word " * 9000], "prompts": ["", ""], "egrm": {"path": "short"}})
    assert r.status_code == 422 and r.json()["error"]["param"] == "query[1]"
    assert "context" in r.json()["error"]["message"]


def test_a_rollout_burst_of_256_one_query_posts_all_get_rewards(engine):
    """OpenRLHF's agent posts one query per sample, all at once (openrlhf/utils/agent.py): a GRPO
    step of 32 prompts x 8 responses is 256 concurrent one-item POSTs; on the default settings they
    queue, each prompt is judged once, and all get a reward (no 429, no 504)."""

    async def burst(base: str) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=256)
        async with httpx.AsyncClient(base_url=base, timeout=180, limits=limits) as http:
            calls = []
            for i in range(256):
                a, b = 10 + (i // 8) % 40, 3 + (i // 8) % 7
                prompt = f"<|im_start|>user\nWhat is {a} + {b}?<|im_end|>\n<|im_start|>assistant\n"
                answer = a + b + (i % 2)  # half right, half off by one
                body = {"query": [f"{prompt}{answer}<|im_end|>"], "prompts": [prompt], "labels": [None]}
                calls.append(http.post("/get_reward", json=body))
            return list(await asyncio.gather(*calls))

    with serve(create_app(Settings(), engine=engine)) as base:
        answers = asyncio.run(burst(base))
        computed = metric(base, 'egrm_shared_questions_total{outcome="miss"}')
    assert [r.status_code for r in answers] == [200] * 256, {r.status_code for r in answers}
    assert computed == 32  # one piece of work per prompt
    rewards = [r.json()["rewards"][0] for r in answers]
    right, wrong = rewards[0::2], rewards[1::2]
    assert sum(right) / 128 > sum(wrong) / 128 + 0.5  # and they mean something: right answers score higher


def test_labels_of_any_json_type_are_taken_never_refused(url):
    """OpenRLHF passes its dataset's label through as any JSON value: one that reads as a number
    decides, any other reaches the judge as text; none is a 422 (the trainer would drop the reward)."""
    labels = [{"answer": "4"}, ["4"], 4.0, {"rubric": "digits or words"}, [3, 4], True, None, ""]
    rewards, verdicts = [], []
    for part in (labels[:4], labels[4:]):  # this server takes 4 queries a request
        body = {"query": QUERIES[:1] * len(part), "prompts": PROMPTS[:1] * len(part), "labels": part}
        r = post(url, {**body, "egrm": {"path": "short", "seed": 1}})
        assert r.status_code == 200, r.text
        rewards += r.json()["rewards"]
        verdicts += r.json()["extra_logs"]["egrm_verdict"]
    assert rewards[:3] == [1.0, 1.0, 1.0] and verdicts[:3] == [1.0, 1.0, 1.0]  # "4" decided, no model call
    assert all(0.0 <= x <= 1.0 for x in rewards[3:])


def test_label_text():
    from egrm.api.openrlhf import label_text

    assert [label_text(x) for x in ("42", 42, 4.5, True, None, "", ["7"], {"ground_truth": 9})] == [
        "42",
        "42",
        "4.5",
        "True",
        None,
        None,
        "7",
        "9",
    ]
    assert label_text({"rubric": "full marks for 4"}) == '{"rubric": "full marks for 4"}'
    assert label_text([1, 2]) == "[1, 2]" and label_text("\ud800") is None
