"""POST /v1/rewards: translate the wire request to pipeline calls and the results back."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from app.api.deps import MetricsDep, PipelineDep, SettingsDep
from app.api.errors import ApiError
from app.api.lifecycle import guarded
from app.config import Settings, temperature_ladder
from app.metrics import Metrics
from app.pipeline.types import ItemResult, JudgeItem, JudgeOptions, PathMode, Usage
from app.protocol import (
    CandidateOut,
    ErrorDetail,
    ErrorResponse,
    RewardOptions,
    RewardRequest,
    RewardResponse,
    RewardResult,
    SampleOut,
    TimingsOut,
)
from app.protocol import Usage as UsageOut

router = APIRouter()

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 413, 422, 429, 500, 503, 504)
}


def resolve_options(options: RewardOptions, settings: Settings) -> JudgeOptions:
    if options.temperatures is not None:
        temperatures = list(options.temperatures)
    else:
        temperatures = temperature_ladder(options.m) if options.m else settings.default_temperatures
    return JudgeOptions(
        temperatures=temperatures,
        top_p=options.top_p if options.top_p is not None else settings.top_p,
        tau=options.tau if options.tau is not None else settings.tau,
        path=PathMode(options.path),
        template=options.template or settings.template,
        return_samples=options.return_samples,
        seed=options.seed,
        long_max_tokens=settings.long_max_tokens,
    )


def judge_items(request: RewardRequest, options: JudgeOptions, settings: Settings) -> list[JudgeItem]:
    if len(request.items) > settings.max_items:
        raise ApiError(413, f"at most {settings.max_items} items per request, got {len(request.items)}", "items")
    if options.template == "pairwise":
        for i, item in enumerate(request.items):
            if item.response_b is None:
                raise ApiError(
                    422, f"items[{i}].response_b is required by the pairwise template", f"items[{i}].response_b"
                )
    return [JudgeItem(i.prompt, i.response, i.response_b, i.reference, i.id) for i in request.items]


def to_wire(index: int, item: JudgeItem, r: ItemResult) -> RewardResult:
    return RewardResult(
        index=index,
        id=item.id,
        reward=r.reward,
        answer=r.answer,
        route=r.route.value if r.route else None,
        consensus=r.consensus,
        votes=r.votes,
        samples=[SampleOut(text=s.text, answer=s.answer, temperature=s.temperature) for s in r.samples]
        if r.samples is not None
        else None,
        candidates=[CandidateOut(reasoning=c.reasoning, answer=c.answer, score=c.score) for c in r.candidates]
        if r.candidates is not None
        else None,
        degraded=r.degraded,
        error=ErrorDetail(type="item_error", message=r.error, param=f"items[{index}]") if r.error else None,
        timings=TimingsOut(**{k: round(getattr(r.timings, k), 3) for k in TimingsOut.model_fields}),
    )


def record(metrics: Metrics, results: list[ItemResult]) -> Usage:
    total = Usage()
    for r in results:
        t = r.timings
        metrics.observe_item(
            r.route.value if r.route else None,
            r.consensus,
            {"sample": t.sample_ms, "reasoning": t.reasoning_ms, "scorer": t.scorer_ms},
            r.degraded,
            r.error is not None,
        )
        total.add(r.usage)
    metrics.observe_tokens(total.prompt_tokens, total.cached_prompt_tokens, total.completion_tokens)
    return total


@router.post("/v1/rewards", response_model=RewardResponse, responses=_ERRORS)
async def rewards(
    body: RewardRequest, request: Request, pipeline: PipelineDep, settings: SettingsDep, metrics: MetricsDep
) -> RewardResponse:
    start = time.perf_counter()
    options = resolve_options(body.options, settings)
    items = judge_items(body, options, settings)
    with metrics.in_flight.track_inprogress():
        work = pipeline.score(items, options, settings.max_prompt_tokens)
        results = await guarded(request, work, settings.request_timeout_s, metrics)
    usage = record(metrics, results)
    metrics.observe_request("/v1/rewards", {r.route.value for r in results if r.route}, time.perf_counter() - start)
    return RewardResponse(
        model=settings.model_name or pipeline.engine.model_name,
        results=[to_wire(i, item, r) for i, (item, r) in enumerate(zip(items, results, strict=True))],
        usage=UsageOut(
            prompt_tokens=usage.prompt_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
        ),
    )
