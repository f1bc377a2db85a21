"""The app factory: create_app(settings) -> FastAPI, with the pipeline built in the lifespan
(factory.py assembles it)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from egrm.api import health, openai_chat, openrlhf, rewards
from egrm.api.errors import install_error_handlers
from egrm.api.guards import GuardMiddleware
from egrm.api.readiness import ReadinessMonitor
from egrm.config import Settings
from egrm.engines.base import Engine
from egrm.factory import pipeline_from
from egrm.gpu_monitor import GpuMonitor
from egrm.metrics import Metrics
from egrm.pipeline.scorer import Scorer

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, engine: Engine | None = None, scorer: Scorer | None = None) -> FastAPI:
    """Build the service; pass an engine to share one loaded model between apps (tests).

    A scorer passed here wins over EGRM_SCORER_URL, and its owner closes it.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.started_at = time.time()
        app.state.metrics = Metrics()
        gpus = GpuMonitor(settings.gpu_metrics_interval_s)
        await asyncio.to_thread(gpus.start)  # loading the NVML library and a first reading block
        app.state.metrics.watch_gpus(gpus.latest)
        async with pipeline_from(settings, engine, scorer) as pipeline:
            # The answer checker's worker starts now (a process, math-verify and sympy: ~0.7 s), not
            # in the first request.
            await pipeline.checker.compare(["0"], ["0"])
            app.state.pipeline = pipeline
            app.state.metrics.watch_engine(pipeline.engine.stats)
            if pipeline.questions is not None:
                app.state.metrics.watch_sharing(pipeline.questions.stats)
            if pipeline.cluster is not None:
                app.state.metrics.watch_cluster(pipeline.cluster.stats)
            app.state.readiness = ReadinessMonitor(pipeline.engine, pipeline.scorer, pipeline.cluster)
            await app.state.readiness.start()
            try:
                yield
            finally:
                await app.state.readiness.close()
                await asyncio.to_thread(gpus.close)

    app = FastAPI(title="egrm", version="0.1.0", summary="Routed generative reward scoring (E-GRM)", lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(
        GuardMiddleware,
        api_keys=settings.api_keys,
        open_paths=settings.open_paths,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
    )
    app.include_router(rewards.router)
    app.include_router(openai_chat.router)
    app.include_router(openrlhf.router)
    app.include_router(health.router)
    return app
