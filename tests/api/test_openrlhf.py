"""POST /get_reward as OpenRLHF's trainer calls it, over real HTTP.

The requests replay OpenRLHF's remote_rm_fn (openrlhf/utils/remote_rm_utils.py): a JSON POST of
{"query": [...], "prompts": [...], "labels": [...]}, where each query is the policy's prompt (chat
template applied) followed by the decoded response.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from tests.live import serve

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


def metric(url: str, series: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return 0.0


def test_openrlhf_request_gets_rewards_scores_and_extra_logs(url):
    r = post(url, {"query": QUERIES, "prompts": PROMPTS, "labels": ["4", "Paris"], "egrm": {"path": "short"}})
    assert r.status_code == 200, r.text
    data = r.json()
    assert len(data["rewards"]) == 2 and all(0.0 <= x <= 1.0 for x in data["rewards"])
    assert data["rewards"][0] == 1.0  # the label "4" reads as a number: it decides, against "4"
    assert data["scores"] == data["rewards"]
    assert set(data["extra_logs"]) == {"egrm_consensus", "egrm_verdict", "egrm_long_route"}
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
    body = {"query": QUERIES[:1], "prompts": PROMPTS[:1], "labels": ["two and two make four"], "egrm": options}
    assert post(url, body).status_code == 200
    assert metric(url, series) - before > plain
    # One that does decides by itself, with no model call, right or wrong.
    before = metric(url, series)
    body = {"query": QUERIES[:1] * 2, "prompts": PROMPTS[:1] * 2, "labels": [4, "5"], "egrm": options}
    r = post(url, body)
    assert r.json()["rewards"] == [1.0, 0.0] and metric(url, series) == before


def test_the_policys_end_of_sequence_and_padding_are_not_the_response(url):
    from app.api.openrlhf import without_end_markers

    assert without_end_markers("4<|im_end|>\n<|endoftext|><pad><pad>") == "4"
    assert without_end_markers("x</s>") == "x" and without_end_markers("a<|im_end|>b") == "a<|im_end|>b"
    query = PROMPTS[0] + "The answer is 4.<|eot_id|><|end_of_text|>[PAD][PAD]"
    body = {"query": [query], "prompts": PROMPTS[:1], "labels": ["4"]}
    assert post(url, body).json()["rewards"] == [1.0]


def test_without_prompts_the_whole_query_is_the_response(url):
    # Seeded: the short path's follow-up turn continues the majority's branch, so the prompt
    # tokens it counts include that sampled answer; unseeded, two equal requests differ by its length.
    options = {"path": "short", "seed": 3}
    series = "egrm_prompt_tokens_total"
    before = metric(url, series)
    r = post(url, {"query": QUERIES[:1], "egrm": options})  # OpenRLHF's older remote_rm_fn
    assert r.status_code == 200 and len(r.json()["rewards"]) == 1
    absent = metric(url, series) - before
    before = metric(url, series)
    assert post(url, {"query": QUERIES[:1], "prompts": [""], "egrm": options}).status_code == 200
    assert metric(url, series) - before == absent


def test_unknown_keys_from_forks_are_ignored(url):
    body = {"query": QUERIES[:1], "prompts": PROMPTS[:1], "labels": [None], "datasources": ["math"]}
    assert post(url, {**body, "egrm": {"path": "short"}}).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"query": QUERIES, "prompts": [PROMPTS[0], PROMPTS[0]]}, 422, "query[1]"),
        ({"query": QUERIES, "prompts": PROMPTS[:1]}, 422, "prompts"),
        ({"query": QUERIES, "prompts": PROMPTS, "labels": ["4"]}, 422, "labels"),
        ({"query": []}, 422, "query"),
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
