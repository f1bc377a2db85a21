"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from egrm.api.deps import MetricsDep
from egrm.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


class Readiness(BaseModel):
    ready: bool
    engine: bool
    scorer: bool
    store: str  # where question work is shared: "in-process", "redis", "redis: degraded (why)", "off"


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request) -> JSONResponse:
    state = request.app.state.readiness.state  # checked in the background (egrm/api/readiness.py)
    engine, scorer = state.engine, state.scorer
    # Only the engine decides readiness. A scorer that does not answer costs long-path quality
    # (those items degrade to the candidates' majority, flagged and counted), not answers; taking
    # every replica out of the load balancer because a shared scorer worker is down would turn
    # that into a full outage. The body still says so, for probes and dashboards. So for Redis: a
    # replica that lost it judges on its own (degraded: the same question may be judged twice).
    pipeline = request.app.state.pipeline
    store = "off" if pipeline.questions is None else "in-process"
    if pipeline.cluster is not None:
        store = pipeline.cluster.describe()
    body = {"ready": engine, "engine": engine, "scorer": scorer, "store": store}
    return JSONResponse(body, status_code=200 if engine else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(m: MetricsDep) -> Response:
    return Response(m.render(), media_type=CONTENT_TYPE)
