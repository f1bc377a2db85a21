"""What every scoring endpoint shares: resolve options, run the pipeline under guard, count it.

/v1/rewards, /v1/chat/completions and /get_reward differ only in how they read their wire
format and write the results back; the work in between, and how it is measured, is one path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import Request

from egrm.api.errors import ApiError
from egrm.api.lifecycle import guarded
from egrm.config import Settings, temperature_ladder
from egrm.metrics import Metrics
from egrm.pipeline.routing import RoutingPolicy
from egrm.pipeline.service import PromptTooLongError, RewardPipeline
from egrm.pipeline.types import ConsensusMode, ItemResult, JudgeItem, JudgeOptions, PathMode, Usage
from egrm.protocol import (
    CandidateOut,
    ErrorResponse,
    JudgementOut,
    RewardOptions,
    SampleOut,
    SharedLiteral,
    TimingsOut,
)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 413, 422, 429, 500, 503, 504)
}


def resolve_options(options: RewardOptions, settings: Settings, policy: RoutingPolicy | None = None) -> JudgeOptions:
    """The request's options over the service's defaults. The judge's routing policy routes the
    auto path unless the request names its own tau (then the method's threshold does)."""
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
        long_accept=settings.long_accept,
        long_window=settings.long_window,
        consensus=ConsensusMode(options.consensus or settings.consensus),
        policy=policy if options.tau is None else None,
    )


_BACKSTOP_S = 5.0  # past the deadline, for work outside the items (encoding a huge batch)


def check_item_count(count: int, settings: Settings, param: str, jobs_per_item: int = 1) -> None:
    """A request too big to take: 413 once (a 429 would be retried by clients for ever)."""
    if count > settings.max_items:
        raise ApiError(413, f"at most {settings.max_items} items per request, got {count}", param)
    if count * jobs_per_item > settings.max_queue:
        message = (
            f"{count} items need {count * jobs_per_item} engine jobs at once, more than the engine queue "
            f"holds (EGRM_MAX_QUEUE={settings.max_queue}): split the request"
        )
        raise ApiError(413, message, param)


def record(metrics: Metrics, results: list[ItemResult]) -> Usage:
    total = Usage()
    for r in results:
        t = r.timings
        # An item that shared its question's work spent none of its stages: they are counted once.
        stages = {"sample": t.sample_ms, "reasoning": t.reasoning_ms, "scorer": t.scorer_ms} if r.shared is None else {}
        metrics.observe_item(
            r.route.value if r.route else None,
            r.consensus,
            stages,
            r.degraded,
            r.error is not None,
        )
        total.add(r.usage)
    metrics.observe_tokens(total.prompt_tokens, total.cached_prompt_tokens, total.completion_tokens)
    return total


async def score_items(
    request: Request,
    pipeline: RewardPipeline,
    settings: Settings,
    metrics: Metrics,
    endpoint: str,
    items: Sequence[JudgeItem],
    options: JudgeOptions,
    item_param: Callable[[int], str] | None = None,
) -> tuple[list[ItemResult], Usage]:
    """Score the items under the request's deadline; count them and the request in the metrics.

    item_param names item i in this endpoint's wire format (e.g. 'query[3]') when its judge
    prompt is over the token limit; without it the pipeline's 'items[i]' stands.
    """
    start = time.perf_counter()
    with metrics.in_flight.track_inprogress():
        # The pipeline keeps the deadline (items still running then get a timeout error, the
        # finished ones their results); the guard's own is a backstop a little later. The request
        # is its items' tag: the engine shares its steps fairly among requests, not among items.
        work = pipeline.score(items, options, settings.max_prompt_tokens, settings.request_timeout_s, tag=object())
        try:
            results = await guarded(request, work, settings.request_timeout_s + _BACKSTOP_S, metrics)
        except PromptTooLongError as exc:
            if item_param is None:
                raise
            message = (
                f"{item_param(exc.index)} renders to a {exc.tokens}-token judge prompt; "
                f"the limit is EGRM_MAX_PROMPT_TOKENS={exc.limit}"
            )
            raise ApiError(413, message, item_param(exc.index)) from exc
    late = [r.error_type == "timeout_error" for r in results]
    if any(late):
        metrics.cancelled.labels(reason="deadline").inc()
    if late and all(late):
        raise deadline_error(settings)
    usage = record(metrics, results)
    metrics.observe_request(endpoint, {r.route.value for r in results if r.route}, time.perf_counter() - start)
    return results, usage


def deadline_error(settings: Settings, param: str | None = None, message: str | None = None) -> ApiError:
    """504: the request's deadline passed. Its questions' work goes on for EGRM_SHARE_GRACE_S and is
    kept, so the same request sent again joins or reads it instead of starting over."""
    message = message or f"request exceeded EGRM_REQUEST_TIMEOUT_S={settings.request_timeout_s:g}s"
    if not settings.share_questions:
        return ApiError(504, message, param, "timeout_error")
    message += f"; its work goes on for {settings.share_grace_s:g}s: retry the same request to get it"
    return ApiError(504, message, param, "timeout_error", headers={"Retry-After": "1"})


def raise_item_errors(results: Sequence[ItemResult], item_param: Callable[[int], str], settings: Settings) -> None:
    """For wire formats without a per-item error slot: the first item that failed fails the request
    (504 if it ran out of time)."""
    for i, r in enumerate(results):
        if r.error_type == "timeout_error":
            raise deadline_error(settings, item_param(i), f"{item_param(i)}: {r.error}")
        if r.error is not None:
            raise ApiError(422, f"{item_param(i)} could not be judged: {r.error}", item_param(i))


def samples_out(r: ItemResult) -> list[SampleOut] | None:
    if r.samples is None:
        return None
    return [SampleOut(text=s.text, temperature=s.temperature, vote=s.vote) for s in r.samples]


def candidates_out(r: ItemResult) -> list[CandidateOut] | None:
    if r.candidates is None:
        return None
    return [
        CandidateOut(reasoning=c.reasoning, answer=c.answer, score=c.score, verdict=c.verdict) for c in r.candidates
    ]


def judgements_out(r: ItemResult) -> list[JudgementOut]:
    return [
        JudgementOut(
            p=j.p,
            verdict=j.verdict,
            verdict_by=j.by.value,
            judge_answer=j.judge_answer,
            response_answer=j.response_answer,
        )
        for j in r.judgements
    ]


def verdict_fields(r: ItemResult) -> dict[str, Any]:
    """The top-level verdict and what decided it, for templates that judge one response."""
    if len(r.judgements) != 1:
        return {"verdict": None, "verdict_by": None, "judgements": judgements_out(r)}
    (j,) = r.judgements
    return {"verdict": j.verdict, "verdict_by": j.by.value, "judgements": judgements_out(r)}


def shared_out(r: ItemResult) -> SharedLiteral | None:
    return None if r.shared is None else r.shared.value  # type: ignore[return-value]


def timings_out(r: ItemResult) -> TimingsOut:
    return TimingsOut(**{k: round(getattr(r.timings, k), 3) for k in TimingsOut.model_fields})


def served_model(settings: Settings, pipeline: RewardPipeline) -> str:
    return settings.model_name or pipeline.engine.model_name
