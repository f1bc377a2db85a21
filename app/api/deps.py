"""Typed access to what the lifespan put on app.state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.config import Settings
from app.metrics import Metrics
from app.pipeline.service import RewardPipeline


def _settings(request: Request) -> Settings:
    return request.app.state.settings


def _pipeline(request: Request) -> RewardPipeline:
    return request.app.state.pipeline


def _metrics(request: Request) -> Metrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(_settings)]
PipelineDep = Annotated[RewardPipeline, Depends(_pipeline)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
