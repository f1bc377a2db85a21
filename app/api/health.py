"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from app.api.deps import MetricsDep, PipelineDep
from app.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


class Readiness(BaseModel):
    ready: bool
    engine: bool
    scorer: bool


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(pipeline: PipelineDep) -> JSONResponse:
    engine, scorer = await pipeline.engine.ready(), await pipeline.scorer.ready()
    ok = engine and scorer
    return JSONResponse({"ready": ok, "engine": engine, "scorer": scorer}, status_code=200 if ok else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(m: MetricsDep) -> Response:
    return Response(m.render(), media_type=CONTENT_TYPE)
