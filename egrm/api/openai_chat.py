"""OpenAI-compatible judging: GET /v1/models, POST /v1/chat/completions.

The conversation to judge arrives as messages: the last one is the assistant response under
judgement, the user turn before it the prompt (earlier turns, if any, are kept in the prompt as
a transcript), and system/developer messages reach the judge as the item's reference (a
reference answer or a rubric). The judgement comes back as the assistant message; the reward
and its details ride in the extra top-level field `egrm`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from egrm.api.deps import MetricsDep, PipelineDep, SettingsDep
from egrm.api.errors import ApiError
from egrm.api.scoring import (
    ERROR_RESPONSES,
    candidates_out,
    raise_item_errors,
    resolve_options,
    samples_out,
    score_items,
    served_model,
    shared_out,
    timings_out,
    verdict_fields,
)
from egrm.chat_text import Turn, transcript
from egrm.pipeline.types import ItemResult, JudgeItem
from egrm.protocol import ErrorResponse, RewardOptions
from egrm.protocol_openai import (
    INT64,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatResponseMessage,
    ChatUsage,
    ChunkChoice,
    ChunkDelta,
    EgrmJudgement,
    ModelCard,
    ModelList,
    PromptTokensDetails,
)

router = APIRouter()
log = logging.getLogger(__name__)

MODEL_ALIAS = "egrm"
_INSTRUCTIONS = ("system", "developer")
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse}}
# An invalid request on this route is OpenAI's 400 with a code (errors.py), not a 422.
_INVALID: dict[int | str, dict[str, Any]] = {400: {"model": ErrorResponse}}


def _started(request: Request) -> int:
    return int(request.app.state.started_at)


@router.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
async def list_models(request: Request, pipeline: PipelineDep, settings: SettingsDep) -> ModelList:
    return ModelList(data=[ModelCard(id=served_model(settings, pipeline), created=_started(request))])


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses={**ERROR_RESPONSES, **_NOT_FOUND})
async def retrieve_model(model_id: str, request: Request, pipeline: PipelineDep, settings: SettingsDep) -> ModelCard:
    check_model(model_id, served_model(settings, pipeline))
    return ModelCard(id=served_model(settings, pipeline), created=_started(request))


def check_model(requested: str, served: str) -> None:
    if requested not in (served, MODEL_ALIAS):
        message = f"the model '{requested}' is not served here; use '{served}' (see GET /v1/models) or '{MODEL_ALIAS}'"
        raise ApiError(404, message, "model", "not_found_error")


# OpenAI parameters that have no meaning for a judgement, and why: accepted, each logged once.
IGNORED = {
    "temperature": "the judge samples a ladder of temperatures (egrm.temperatures)",
    "max_tokens": "the judgement is a few tokens",
    "max_completion_tokens": "the judgement is a few tokens",
    "stop": "the judgement is a few tokens",
    "logprobs": "the reward (egrm.reward) is the judge's probability",
    "top_logprobs": "the reward (egrm.reward) is the judge's probability",
    "frequency_penalty": "the judge's samples follow the method's sampling (temperature ladder, top_p)",
    "presence_penalty": "the judge's samples follow the method's sampling (temperature ladder, top_p)",
    "logit_bias": "the judge's samples follow the method's sampling (temperature ladder, top_p)",
    "prediction": "the judgement is a few tokens",
    "reasoning_effort": "the route decides when the judge reasons (egrm.path, egrm.tau)",
    "verbosity": "the judgement is a few tokens",
    "web_search_options": "the judge does not search",
    "moderation": "the judgement is not moderated",
}
_warned: set[str] = set()  # the ignored parameters already logged


def refused(body: ChatCompletionRequest) -> tuple[str, str] | None:
    """(parameter, why) when accepting the request would mislead: it asks for what a judgement
    cannot be (several choices, JSON, a tool call, audio)."""
    response_type = (body.response_format or {}).get("type", "text")
    forced_tool = body.tool_choice not in (None, "none", "auto") or body.function_call not in (None, "none", "auto")
    if body.n not in (None, 1):
        return "n", "egrm returns one judgement per request; the judge's samples are egrm.m"
    if response_type != "text":
        return "response_format", f"the judgement is text ({response_type!r} asked); read it from egrm"
    if forced_tool:
        name = "tool_choice" if body.tool_choice not in (None, "none", "auto") else "function_call"
        return name, "the judge calls no tool: only 'none' or 'auto'"
    if body.audio is not None or (body.modalities is not None and set(body.modalities) != {"text"}):
        return ("audio" if body.audio is not None else "modalities"), "the judgement is text only"
    return None


def chat_options(body: ChatCompletionRequest) -> RewardOptions:
    """egrm's options from the request; OpenAI's own parameters mapped, ignored, or refused naming the field."""
    refusal = refused(body)
    if refusal is not None:
        raise ApiError(422, f"{refusal[0]}: {refusal[1]}", refusal[0])
    for name, why in IGNORED.items():
        if getattr(body, name) is not None and name not in _warned:
            _warned.add(name)
            log.warning("/v1/chat/completions: '%s' is accepted and ignored (logged once): %s", name, why)
    options = body.egrm or RewardOptions()
    # OpenAI's seed is any int64; egrm's is >= 0: the same seed always maps to the same one.
    seed = None if body.seed is None else body.seed % INT64
    mapped = {"top_p": body.top_p, "seed": seed}
    for name, value in mapped.items():
        if value is not None and getattr(options, name) is not None:
            raise ApiError(422, f"{name}: given twice, as {name} and egrm.{name}; give one", name)
    options = options.model_copy(update={k: v for k, v in mapped.items() if v is not None})
    if options.template == "pairwise":
        raise ApiError(
            422, "egrm.template: pairwise needs two responses; use POST /v1/rewards with response_b", "egrm.template"
        )
    return options


def judge_item(messages: list[ChatMessage]) -> JudgeItem:
    """The (prompt, response, reference) of a conversation; a misplaced turn is named by its index."""
    turns = [(i, m) for i, m in enumerate(messages) if m.role not in _INSTRUCTIONS]
    if not turns or turns[-1][1].role != "assistant":
        at = turns[-1][0] if turns else len(messages) - 1
        message = f"messages[{at}]: the last message must be the assistant response to judge"
        raise ApiError(422, message, f"messages[{at}]")
    if len(turns) < 2 or turns[-2][1].role != "user":
        at = turns[-2][0] if len(turns) >= 2 else turns[-1][0]
        raise ApiError(422, f"messages[{at}]: the response must follow a user message (the prompt)", f"messages[{at}]")
    user_at, user = turns[-2]
    if not user.text.strip():
        raise ApiError(422, f"messages[{user_at}].content: the prompt is empty", f"messages[{user_at}].content")
    # Earlier turns are context the response may depend on: keep them, as a transcript, in the prompt.
    prompt = transcript([Turn(m.role, m.text) for _, m in turns[:-2]], user.text)
    instructions = [m.text for m in messages if m.role in _INSTRUCTIONS and m.text.strip()]
    return JudgeItem(prompt=prompt, response=turns[-1][1].text, reference="\n\n".join(instructions) or None)


def judgement(r: ItemResult, template: str) -> EgrmJudgement:
    assert r.reward is not None and r.answer is not None and r.route is not None  # raise_item_errors ran
    return EgrmJudgement(
        reward=r.reward,
        answer=r.answer,
        **verdict_fields(r),
        route=r.route.value,
        consensus=r.consensus,
        votes=r.votes,
        exact_consensus=r.exact.probability if r.exact else None,
        template=template,
        samples=samples_out(r),
        candidates=candidates_out(r),
        degraded=r.degraded,
        shared=shared_out(r),
        timings=timings_out(r),
    )


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletionResponse,
    responses={**ERROR_RESPONSES, **_INVALID, **_NOT_FOUND},
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, pipeline: PipelineDep, settings: SettingsDep, metrics: MetricsDep
) -> ChatCompletionResponse | StreamingResponse:
    model = served_model(settings, pipeline)
    check_model(body.model, model)
    options = resolve_options(chat_options(body), settings, pipeline.policy)
    item = judge_item(body.messages)
    (result,), usage = await score_items(
        request, pipeline, settings, metrics, "/v1/chat/completions", [item], options, lambda _: "messages"
    )
    raise_item_errors([result], lambda _: "messages", settings)
    verdict = judgement(result, options.template)
    completion = ChatCompletionResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=model,
        choices=[ChatChoice(message=ChatResponseMessage(content=verdict.answer))],
        usage=ChatUsage(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_prompt_tokens),
        ),
        egrm=verdict,
    )
    if body.stream:
        include_usage = bool((body.stream_options or {}).get("include_usage"))
        return StreamingResponse(_events(completion, include_usage), media_type="text/event-stream")
    return completion


def _events(completion: ChatCompletionResponse, include_usage: bool) -> Iterator[str]:
    """The judgement as OpenAI streams a completion: the content in one chunk, then the finish
    (with the judgement in `egrm`), then, only with stream_options.include_usage, a chunk with no
    choices and the usage (the others then carry "usage": null), then [DONE]. The judgement is
    complete before the first event, so an error is still a plain JSON error response."""
    head = {"id": completion.id, "created": completion.created, "model": completion.model}
    content = ChunkDelta(role="assistant", content=completion.choices[0].message.content)
    chunks = [
        ChatCompletionChunk(**head, choices=[ChunkChoice(delta=content)]),
        ChatCompletionChunk(
            **head, choices=[ChunkChoice(delta=ChunkDelta(), finish_reason="stop")], egrm=completion.egrm
        ),
    ]
    if include_usage:
        chunks.append(ChatCompletionChunk(**head, choices=[], usage=completion.usage))
    for chunk in chunks:
        event = chunk.model_dump(mode="json", exclude_none=True)
        if include_usage:
            event.setdefault("usage", None)
        yield f"data: {json.dumps(event)}\n\n"
    yield "data: [DONE]\n\n"
