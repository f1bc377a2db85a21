"""POST /v1/rewards: translate the wire request to pipeline calls and the results back."""

from __future__ import annotations

from fastapi import APIRouter, Request

from egrm.api.deps import MetricsDep, PipelineDep, SettingsDep
from egrm.api.errors import ApiError
from egrm.api.items import judge_item
from egrm.api.scoring import (
    ERROR_RESPONSES,
    candidates_out,
    check_item_count,
    resolve_options,
    samples_out,
    score_items,
    served_model,
    shared_out,
    timings_out,
    verdict_fields,
)
from egrm.config import Settings
from egrm.pipeline.routing import describe_routing
from egrm.pipeline.templates import get_template
from egrm.pipeline.types import ItemResult, JudgeItem, JudgeOptions
from egrm.protocol import (
    ErrorDetail,
    RewardRequest,
    RewardResponse,
    RewardResult,
)
from egrm.protocol import Usage as UsageOut

router = APIRouter()


def judge_items(request: RewardRequest, options: JudgeOptions, settings: Settings) -> list[JudgeItem]:
    check_item_count(len(request.items), settings, "items", get_template(options.template).responses)
    if options.template == "pairwise":
        for i, item in enumerate(request.items):
            if item.response_b is None:
                raise ApiError(
                    422, f"items[{i}].response_b is required by the pairwise template", f"items[{i}].response_b"
                )
    return [judge_item(i) for i in request.items]


def to_wire(index: int, item: JudgeItem, r: ItemResult) -> RewardResult:
    return RewardResult(
        index=index,
        id=item.id,
        reward=r.reward,
        answer=r.answer,
        **verdict_fields(r),
        route=r.route.value if r.route else None,
        consensus=r.consensus,
        votes=r.votes,
        exact_consensus=r.exact.probability if r.exact else None,
        samples=samples_out(r),
        samples_drawn=r.samples_drawn,
        candidates=candidates_out(r),
        degraded=r.degraded,
        shared=shared_out(r),
        error=ErrorDetail(type=r.error_type, message=r.error, param=f"items[{index}]") if r.error else None,
        timings=timings_out(r),
    )


@router.post("/v1/rewards", response_model=RewardResponse, responses=ERROR_RESPONSES)
async def rewards(
    body: RewardRequest, request: Request, pipeline: PipelineDep, settings: SettingsDep, metrics: MetricsDep
) -> RewardResponse:
    options = resolve_options(body.options, settings, pipeline.policy)
    items = judge_items(body, options, settings)
    results, usage = await score_items(request, pipeline, settings, metrics, "/v1/rewards", items, options)
    return RewardResponse(
        model=served_model(settings, pipeline),
        routing=describe_routing(options.policy, options.tau),
        results=[to_wire(i, item, r) for i, (item, r) in enumerate(zip(items, results, strict=True))],
        usage=UsageOut(
            prompt_tokens=usage.prompt_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.prompt_tokens + usage.completion_tokens,
        ),
    )
