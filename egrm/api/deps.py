"""Typed access to what the lifespan put on app.state.

Async on purpose: FastAPI runs a plain `def` dependency in a worker thread, a thread hop per
request for a dictionary lookup.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from egrm.config import Settings
from egrm.metrics import Metrics
from egrm.pipeline.service import RewardPipeline


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


async def _pipeline(request: Request) -> RewardPipeline:
    return request.app.state.pipeline


async def _metrics(request: Request) -> Metrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(_settings)]
PipelineDep = Annotated[RewardPipeline, Depends(_pipeline)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
