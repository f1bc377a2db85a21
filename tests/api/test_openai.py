"""The OpenAI-compatible endpoints, spoken to by the official `openai` SDK over real HTTP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from egrm.api.errors import ApiError
from egrm.api.openai_chat import judge_item
from egrm.config import Settings
from egrm.main import create_app
from egrm.pipeline.templates import JUDGE
from egrm.protocol_openai import ChatMessage
from tests.live import metric, serve

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
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
    assert 6 <= usage.completion_tokens <= 5 * JUDGE.answer_tokens + 1  # five own answers, then one verdict
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
    egrm = a.model_extra["egrm"]
    # M=5, and 5 more where the shipped routing policy asks for them (a vote short of unanimous).
    assert len(egrm["samples"]) == sum(egrm["votes"].values()) in (5, 10)


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
        ({"extra_body": {"frobnicate": 1}}, 400, "frobnicate", "unknown_parameter"),
        # Accepting these would mislead: they ask for what a judgement cannot be.
        ({"response_format": {"type": "json_object"}}, 400, "response_format", "invalid_value"),
        ({"tools": [TOOL], "tool_choice": "required"}, 400, "tool_choice", "invalid_value"),
        ({"modalities": ["text", "audio"]}, 400, "modalities", "invalid_value"),
        ({"seed": 2**63}, 400, "seed", "invalid_value"),
    ],
)
def test_refusals_are_openais_400_naming_the_field_in_the_sdk_error(client, kwargs, status, param, code):
    request = {"model": "egrm", "messages": QUESTION, **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**request)
    assert err.value.status_code == status, err.value.message
    assert err.value.param == param and err.value.code == code
    assert err.value.type == ("not_found_error" if status == 404 else "invalid_request_error")


# A value for every parameter of the SDK's Chat Completions create, as a client would send it.
EVERY_PARAMETER = {
    "audio": None,  # refused when set (the judgement is text): see the refusals above
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [TOOL["function"]],
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "max_completion_tokens": 64,
    "max_tokens": 64,
    "metadata": {"run": "grpo-7"},
    "modalities": ["text"],
    "moderation": None,
    "n": 1,
    "parallel_tool_calls": False,
    "prediction": {"type": "content", "content": "Yes"},
    "presence_penalty": -0.5,
    "prompt_cache_key": "judge",
    "prompt_cache_options": None,
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "text"},
    "safety_identifier": "user-1",
    "seed": -(2**63),  # OpenAI's seed is any int64
    "service_tier": "auto",
    "stop": ["\n"],
    "store": False,
    "stream": False,
    "stream_options": None,
    "temperature": 0.2,
    "tool_choice": "auto",
    "tools": [TOOL],
    "top_logprobs": 3,
    "top_p": 0.9,
    "user": "trainer-7",
    "verbosity": "low",
    "web_search_options": {},
}


def test_every_parameter_of_the_sdks_create_is_accepted(client):
    """Read from the installed SDK: a parameter OpenAI adds fails here until it is placed."""
    import inspect

    from openai.resources.chat.completions import Completions

    request_options = {"self", "messages", "model", "extra_headers", "extra_query", "extra_body", "timeout"}
    sdk = set(inspect.signature(Completions.create).parameters) - request_options
    assert sdk <= set(EVERY_PARAMETER), f"Chat Completions parameters to place: {sorted(sdk - set(EVERY_PARAMETER))}"
    sent = {k: v for k, v in EVERY_PARAMETER.items() if k in sdk and v is not None}
    a = client.chat.completions.create(model="egrm", messages=QUESTION, **sent)
    b = client.chat.completions.create(model="egrm", messages=QUESTION, seed=-(2**63), top_p=0.9)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.model_extra["egrm"]["reward"] == b.model_extra["egrm"]["reward"]  # seed and top_p reached the judge
    assert a.choices[0].logprobs is None  # accepted, ignored: the reward is the judge's probability


def test_the_sdks_own_streaming_loops(client):
    """The loops openai-python's docs write: content from every chunk's first choice (no usage
    chunk unless asked), and with include_usage the usage on a last chunk without choices."""
    whole = client.chat.completions.create(model="egrm", messages=QUESTION, extra_body=SHORT)
    stream = client.chat.completions.create(model="egrm", messages=QUESTION, stream=True, extra_body=SHORT)
    text = ""
    for chunk in stream:
        text += chunk.choices[0].delta.content or ""
        assert chunk.usage is None
    assert text == whole.choices[0].message.content
    stream = client.chat.completions.create(
        model="egrm", messages=QUESTION, stream=True, stream_options={"include_usage": True}, extra_body=SHORT
    )
    chunks = list(stream)
    assert [c.usage is None for c in chunks] == [True] * (len(chunks) - 1) + [False]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    with client.chat.completions.stream(model="egrm", messages=QUESTION, extra_body=SHORT) as helper:
        final = helper.get_final_completion()
    assert final.choices[0].message.content == whole.choices[0].message.content


def test_stream_true_answers_server_sent_events_as_openai_sends_them(client, url):
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
    body = {"model": "egrm", "messages": QUESTION, "stream": True, "egrm": SHORT["egrm"]}
    raw = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and raw.text.count("data: ") == 3  # no usage chunk
    assert '"usage"' not in raw.text
    with_usage = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}})
    events = [json.loads(line[6:]) for line in with_usage.text.splitlines() if line.startswith("data: {")]
    assert [e["usage"] is None for e in events] == [True, True, False]  # "usage": null, then the usage


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
