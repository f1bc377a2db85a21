"""The OpenAI-compatible endpoints, spoken to by the official `openai` SDK over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest

from app.api.errors import ApiError
from app.api.openai_chat import judge_item
from app.config import Settings
from app.main import create_app
from app.protocol_openai import ChatMessage
from tests.live import serve

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
SHORT = {"egrm": {"path": "short", "seed": 3}}


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serve(create_app(Settings(), engine=engine)) as base:
        yield base


@pytest.fixture
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="not-checked", max_retries=0)


def served_id(client: openai.OpenAI) -> str:
    (model,) = client.models.list().data
    return model.id


def metric(url: str, series: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return 0.0


def test_models_list_and_retrieve(client):
    model_id = served_id(client)
    assert model_id and client.models.retrieve(model_id).id == model_id
    assert client.models.retrieve("egrm").id == model_id  # the alias
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.param == "model" and model_id in err.value.message


def test_chat_completion_carries_the_judgement(client, url):
    before = metric(url, 'egrm_route_total{route="short"}')
    completion = client.chat.completions.create(model=served_id(client), messages=QUESTION, extra_body=SHORT)
    (choice,) = completion.choices
    egrm = completion.model_extra["egrm"]
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert choice.message.content == egrm["answer"] and egrm["answer"] in ("Yes", "No")
    assert egrm["reward"] == (1.0 if egrm["answer"] == "Yes" else 0.0)
    assert egrm["route"] == "short" and sum(egrm["votes"].values()) == 5 and egrm["template"] == "verdict"
    assert egrm["consensus"] == max(egrm["votes"].values()) / 5
    usage = completion.usage
    assert 6 <= usage.completion_tokens <= 5 * 16 + 1  # five own answers, then one verdict
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # One prefill for five rows: at least four fifths cached, more when the prefix cache already
    # holds the template's head (the session's engine has served other requests).
    # Six rows (five samples, the verdict's follow-up turn) over one prefill: far below five prefills.
    assert 0 < usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens < 2 * usage.prompt_tokens // 6
    assert completion.id.startswith("chatcmpl-") and completion.object == "chat.completion"
    # Counted like /v1/rewards: the route counter and the request latency by endpoint.
    assert metric(url, 'egrm_route_total{route="short"}') == before + 1
    assert metric(url, 'egrm_request_latency_seconds_count{endpoint="/v1/chat/completions",route="short"}') >= 1


def test_the_alias_model_and_openai_params_that_map(client):
    a = client.chat.completions.create(
        model="egrm", messages=QUESTION, seed=7, top_p=0.9, extra_body={"egrm": {"return_samples": True}}
    )
    b = client.chat.completions.create(
        model="egrm", messages=QUESTION, seed=7, top_p=0.9, extra_body={"egrm": {"return_samples": True}}
    )
    assert a.model_extra["egrm"]["samples"] == b.model_extra["egrm"]["samples"]  # seed reached the judge
    assert len(a.model_extra["egrm"]["samples"]) == 5


def test_the_system_message_reaches_the_judge(client):
    plain = client.chat.completions.create(model="egrm", messages=QUESTION, extra_body=SHORT)
    rubric = [{"role": "system", "content": "Accept the answer in digits or in words."}, *QUESTION]
    ruled = client.chat.completions.create(model="egrm", messages=rubric, extra_body=SHORT)
    # A rubric is rendered into the judge prompt (as the reference): the prompt grows by its tokens.
    assert ruled.usage.prompt_tokens > plain.usage.prompt_tokens


def test_a_system_message_that_reads_as_a_number_decides_without_the_model(client):
    answer = [{"role": "system", "content": "4"}, *QUESTION]
    decided = client.chat.completions.create(model="egrm", messages=answer, extra_body=SHORT)
    egrm = decided.model_extra["egrm"]
    assert (egrm["route"], egrm["verdict_by"], egrm["reward"]) == ("reference", "reference", 1.0)
    assert decided.usage.prompt_tokens == 0 and decided.choices[0].message.content == "Yes"


def test_async_client(url):
    async def judge() -> list[openai.types.chat.ChatCompletion]:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
            calls = [
                client.chat.completions.create(
                    model="egrm",
                    messages=[{"role": "user", "content": f"What is {i}+{i}?"}, {"role": "assistant", "content": "4"}],
                    extra_body=SHORT,
                )
                for i in range(3)
            ]
            return list(await asyncio.gather(*calls))

    completions = asyncio.run(judge())
    assert [c.choices[0].message.content in ("Yes", "No") for c in completions] == [True] * 3
    assert all(c.model_extra["egrm"]["route"] == "short" for c in completions)


@pytest.mark.parametrize(
    ("kwargs", "status", "param", "code"),
    [
        ({"model": "gpt-4o"}, 404, "model", None),
        ({"n": 2}, 400, "n", "invalid_value"),
        ({"seed": 1, "extra_body": {"egrm": {"seed": 2}}}, 400, "seed", "invalid_value"),
        ({"temperature": 3.0}, 400, "temperature", "invalid_value"),
        ({"extra_body": {"egrm": {"m": 17}}}, 400, "egrm.m", "invalid_value"),
        ({"extra_body": {"egrm": {"template": "pairwise"}}}, 400, "egrm.template", "invalid_value"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "messages", "invalid_value"),
        ({"messages": [*QUESTION, {"role": "user", "content": "and?"}]}, 400, "messages[2]", "invalid_value"),
        (
            {"messages": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]},
            400,
            "messages[0]",
            "invalid_value",
        ),
        (
            {"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "4"}]},
            400,
            "messages[0].content",
            "invalid_value",
        ),
        ({"messages": [{"role": "wizard", "content": "x"}, *QUESTION]}, 400, "messages[0].role", "invalid_value"),
        ({"extra_body": {"logit_bias": {"1": 2}}}, 400, "logit_bias", "unknown_parameter"),
    ],
)
def test_refusals_are_openais_400_naming_the_field_in_the_sdk_error(client, kwargs, status, param, code):
    request = {"model": "egrm", "messages": QUESTION, **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**request)
    assert err.value.status_code == status, err.value.message
    assert err.value.param == param and err.value.code == code
    assert err.value.type == ("not_found_error" if status == 404 else "invalid_request_error")


def test_the_parameters_sdks_send_are_accepted(client):
    """veRL's GenRM helper and SDK defaults send these; seed maps, the others are ignored and logged."""
    sent = {
        "temperature": 0.0,
        "top_p": 0.9,
        "max_tokens": 8,
        "max_completion_tokens": 8,
        "n": 1,
        "seed": 3,
        "stop": ["\n"],
        "user": "trainer-7",
        "metadata": {"run": "ppo"},
        "logprobs": False,
    }
    a = client.chat.completions.create(model="egrm", messages=QUESTION, **sent)
    b = client.chat.completions.create(model="egrm", messages=QUESTION, seed=3, top_p=0.9)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.model_extra["egrm"]["reward"] == b.model_extra["egrm"]["reward"]  # the seed reached the judge


def test_stream_true_answers_server_sent_events_the_sdk_reads(client, url):
    chunks = list(
        client.chat.completions.create(
            model="egrm", messages=QUESTION, stream=True, stream_options={"include_usage": True}, extra_body=SHORT
        )
    )
    whole = client.chat.completions.create(model="egrm", messages=QUESTION, extra_body=SHORT)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices] == [None, "stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[1].model_extra["egrm"]["reward"] == whole.model_extra["egrm"]["reward"]
    raw = httpx.post(f"{url}/v1/chat/completions", json={"model": "egrm", "messages": QUESTION, "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and raw.text.count("data: ") == 4


def test_a_prompt_over_the_token_limit_names_messages(engine):
    with serve(create_app(Settings(max_prompt_tokens=64), engine=engine)) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        long = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "4"}]
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="egrm", messages=long)
    assert err.value.status_code == 413 and err.value.param == "messages"
    assert "EGRM_MAX_PROMPT_TOKENS" in err.value.message


def test_api_keys_apply(engine):
    with serve(create_app(Settings(api_keys=["k1"]), engine=engine)) as base:
        good = openai.OpenAI(base_url=f"{base}/v1", api_key="k1", max_retries=0)
        assert good.chat.completions.create(model="egrm", messages=QUESTION, extra_body=SHORT).choices
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()


def test_conversation_mapping():
    def msgs(*pairs: tuple[str, str]) -> list[ChatMessage]:
        return [ChatMessage(role=r, content=c) for r, c in pairs]  # type: ignore[arg-type]

    item = judge_item(msgs(("system", "Rubric: 4."), ("user", "2+2?"), ("assistant", "4")))
    assert (item.prompt, item.response, item.reference) == ("2+2?", "4", "Rubric: 4.")
    item = judge_item(msgs(("user", "Hi"), ("assistant", "Hello"), ("user", "2+2?"), ("assistant", "4")))
    assert item.prompt == "user: Hi\n\nassistant: Hello\n\nuser: 2+2?" and item.reference is None
    parts = [ChatMessage(role="user", content=[{"type": "text", "text": "2+"}, {"type": "text", "text": "2?"}])]
    item = judge_item([*parts, ChatMessage(role="assistant", content="4")])
    assert item.prompt == "2+2?"
    with pytest.raises(ApiError) as err:
        judge_item(msgs(("system", "x"), ("assistant", "4")))
    assert err.value.param == "messages[1]"
