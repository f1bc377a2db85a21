"""The app factory: create_app(settings) -> FastAPI, with the engine built in the lifespan."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from app.api import health, openai_chat, openrlhf, rewards
from app.api.errors import install_error_handlers
from app.api.guards import GuardMiddleware
from app.api.readiness import ReadinessMonitor
from app.config import Settings
from app.engines.base import Engine
from app.engines.chat_templates import template_text
from app.gpu_sampler import GpuSampler
from app.metrics import Metrics
from app.pipeline.service import RewardPipeline
from app.pipeline.sharing import SharingLimits
from app.scorer.base import Scorer
from app.scorer.client import HttpScorer
from app.scorer.registry import load_scorer

log = logging.getLogger(__name__)


def model_path(settings: Settings) -> Path:
    """The local model folder: the embedded engine's weights, a remote engine's tokenizer."""
    from app.engines.embedded.fetch import model_dir

    path = Path(settings.model).expanduser() if settings.model else model_dir(settings.cache_dir)
    if not path.exists():
        raise RuntimeError(f"no model at {path}: run `egrm fetch-model` (or set EGRM_MODEL)")
    return path


def adapter_path(settings: Settings) -> Path | None:
    """The LoRA adapter to merge: EGRM_ADAPTER, or the shipped judge adapter on the default model."""
    if settings.adapter == "none" or (not settings.adapter and settings.model):
        return None
    if settings.adapter:
        return Path(settings.adapter).expanduser()
    from app.judge import DEFAULT_ADAPTER

    return DEFAULT_ADAPTER


def judge_model_path(settings: Settings) -> Path:
    """The embedded engine's weights: the model folder with its adapter merged in (cached)."""
    path, adapter = model_path(settings), adapter_path(settings)
    if adapter is None:
        return path
    from app.engines.embedded.adapter import merged_model

    return merged_model(path, adapter, settings.cache_dir)


def build_engine(settings: Settings) -> Engine:
    if settings.engine != "embedded":
        return _remote(settings)
    from app.engines.embedded.engine import EmbeddedEngine  # torch loads only when needed
    from app.engines.embedded.loader import resolve_dtype

    path = judge_model_path(settings)
    dtype = resolve_dtype(settings.dtype, settings.device)
    log.info("loading %s (dtype %s, asked %s)", path, dtype, settings.dtype)
    return EmbeddedEngine.load(
        str(path),
        dtype=dtype,
        chat_template=template_text(settings.chat_template),
        threads=settings.threads,
        device=settings.device,
        layout=settings.parallel_mode,
        kv_cache_mb=settings.kv_cache_mb,
        prefix_cache=settings.prefix_cache,
        batch_window_ms=settings.batch_window_ms,
        max_batch_branches=settings.max_batch_branches,
        max_batch_tokens=settings.max_batch_tokens,
        max_queue=settings.max_queue,
    )


def _remote(settings: Settings) -> Engine:
    """An engine that samples on another server; egrm keeps only the model's tokenizer."""
    from app.engines.remote.base import RemoteEngine
    from app.engines.remote.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_path(settings), template_text(settings.chat_template))
    timeout_s, max_queue = settings.backend_timeout_s, settings.max_queue
    engine: RemoteEngine
    if settings.engine == "sglang":
        from app.engines.sglang import SGLangEngine

        key = settings.sglang_api_key.get_secret_value()
        engine = SGLangEngine(tokenizer, settings.sglang_url, key, timeout_s, max_queue)
    elif settings.engine == "openai":
        from app.engines.openai import OpenAIEngine

        key = settings.openai_api_key.get_secret_value()
        engine = OpenAIEngine(
            tokenizer, settings.openai_url, key, settings.openai_model, settings.openai_dialect, timeout_s, max_queue
        )
    else:
        from app.engines.llamacpp import LlamaCppEngine

        key = settings.llamacpp_api_key.get_secret_value()
        engine = LlamaCppEngine(tokenizer, settings.llamacpp_url, key, timeout_s, max_queue)
    log.info("engine: %s at %s", engine.KIND, engine.url)
    return engine


def build_scorer(settings: Settings) -> Scorer:
    """The worker over HTTP when EGRM_SCORER_URL is set, else the checkpoint in this process."""
    if settings.scorer_url:
        return HttpScorer(settings.scorer_url, timeout_s=settings.scorer_timeout_s, retries=settings.scorer_retries)
    return load_scorer(settings.scorer_checkpoint)


def sharing_limits(settings: Settings) -> SharingLimits | None:
    """How question work is shared (EGRM_SHARE_*); None when it is not."""
    if not settings.share_questions:
        return None
    return SharingLimits(
        max_entries=settings.share_max_entries,
        max_bytes=int(settings.share_max_mb * 2**20),
        ttl_s=settings.share_ttl_s,
        grace_s=settings.share_grace_s,
    )


def create_app(settings: Settings | None = None, engine: Engine | None = None, scorer: Scorer | None = None) -> FastAPI:
    """Build the service; pass an engine to share one loaded model between apps (tests).

    A scorer passed here wins over EGRM_SCORER_URL, and its owner closes it.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = engine is None
        the_engine: Engine = engine if engine is not None else await asyncio.to_thread(build_engine, settings)
        the_scorer = scorer if scorer is not None else build_scorer(settings)
        app.state.settings = settings
        app.state.started_at = time.time()
        app.state.metrics = Metrics()
        app.state.metrics.watch_engine(the_engine.stats)
        gpus = GpuSampler(settings.gpu_metrics_interval_s)
        await asyncio.to_thread(gpus.start)  # loading the NVML library and a first reading block
        app.state.metrics.watch_gpus(gpus.latest)
        app.state.pipeline = RewardPipeline(the_engine, the_scorer, sharing=sharing_limits(settings))
        if app.state.pipeline.questions is not None:
            app.state.metrics.watch_sharing(app.state.pipeline.questions.stats)
        app.state.readiness = ReadinessMonitor(the_engine, the_scorer)
        await app.state.readiness.start()
        try:
            yield
        finally:
            await app.state.readiness.close()
            await app.state.pipeline.close()
            await asyncio.to_thread(gpus.close)
            if owned:
                await the_engine.close()
            if scorer is None:
                await the_scorer.close()

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
