"""The scorer worker: a small HTTP app that rates long-path candidates, apart from the LLM process.

POST /v1/score (candidates -> scores, same order), /healthz, /readyz, /metrics. Errors have the
main API's shape ({"error": {"type", "message", "param"}}); bad input is a 422 naming the field.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from egrm.api.errors import install_error_handlers
from egrm.api.guards import GuardMiddleware
from egrm.metrics import CONTENT_TYPE, WorkerMetrics
from egrm.pipeline.scorer import Scorer
from egrm.protocol import ErrorResponse
from egrm.scorer.wire import MAX_BODY_BYTES, ScoreRequest, ScoreResponse

SCORE_PATH = "/v1/score"

router = APIRouter()


async def _scorer(request: Request) -> Scorer:
    return request.app.state.scorer


async def _metrics(request: Request) -> WorkerMetrics:
    return request.app.state.metrics


ScorerDep = Annotated[Scorer, Depends(_scorer)]
MetricsDep = Annotated[WorkerMetrics, Depends(_metrics)]

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (413, 422, 500)}


@router.post(SCORE_PATH, response_model=ScoreResponse, responses=_ERRORS)
async def score(body: ScoreRequest, scorer: ScorerDep, metrics: MetricsDep) -> ScoreResponse:
    candidates = [c.to_candidate() for c in body.candidates]
    scores = await scorer.score(candidates)
    metrics.candidates.inc(len(candidates))
    return ScoreResponse(scores=scores, scorer=type(scorer).__name__, calibrated=scorer.calibrated)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "the scorer cannot answer"}})
async def readyz(scorer: ScorerDep) -> JSONResponse:
    ok = await scorer.ready()
    return JSONResponse({"ready": ok, "calibrated": scorer.calibrated}, status_code=200 if ok else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(m: MetricsDep) -> Response:
    return Response(m.render(), media_type=CONTENT_TYPE)


def create_worker_app(scorer: Scorer) -> FastAPI:
    """The worker around an already loaded scorer (the CLI loads it first, so a bad checkpoint fails fast)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.scorer = scorer
        app.state.metrics = WorkerMetrics()
        try:
            yield
        finally:
            await scorer.close()

    app = FastAPI(title="egrm scorer worker", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(
        GuardMiddleware, api_keys=[], open_paths=[], max_body_bytes=MAX_BODY_BYTES, limit_name="the worker's limit"
    )

    # Outermost, so refused bodies (413) and invalid ones (422) are counted with the rest.
    @app.middleware("http")
    async def count_score_requests(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path != SCORE_PATH:
            return await call_next(request)
        start = time.perf_counter()
        status = 500  # an unhandled error is answered outside this middleware, as a 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            request.app.state.metrics.observe_request(status, time.perf_counter() - start)

    app.include_router(router)
    return app
