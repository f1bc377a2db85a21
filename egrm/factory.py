"""One place that assembles the service from Settings: the engine, the scorer, the answer
checker and the reward pipeline. The server (main.py), `egrm score`, `egrm eval` and the training
tools all build through here, so they judge alike."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from egrm.config import Settings
from egrm.engines.base import Engine
from egrm.engines.chat_templates import template_text
from egrm.pipeline.cluster import ClusterLimits
from egrm.pipeline.routing import RoutingPolicy
from egrm.pipeline.scorer import Scorer
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.sharing import SharingLimits
from egrm.scorer.client import HttpScorer
from egrm.scorer.registry import load_scorer

log = logging.getLogger(__name__)


def model_path(settings: Settings) -> Path:
    """The local model folder: the embedded engine's weights, a remote engine's tokenizer."""
    from egrm.engines.embedded.fetch import model_dir

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
    from egrm.judge import DEFAULT_ADAPTER

    return DEFAULT_ADAPTER


def judge_model_path(settings: Settings) -> Path:
    """The embedded engine's weights: the model folder with its adapter merged in (cached)."""
    path, adapter = model_path(settings), adapter_path(settings)
    if adapter is None:
        return path
    from egrm.engines.embedded.adapter import merged_model

    return merged_model(path, adapter, settings.cache_dir)


def build_engine(settings: Settings) -> Engine:
    if settings.engine != "embedded":
        return _remote(settings)
    from egrm.engines.embedded.engine import EmbeddedEngine  # torch loads only when needed
    from egrm.engines.embedded.loader import resolve_dtype

    path = judge_model_path(settings)
    dtype = resolve_dtype(settings.dtype, settings.device)
    log.info("loading %s (dtype %s, asked %s)", path, dtype, settings.dtype)
    return EmbeddedEngine.load(
        str(path),
        dtype=dtype,
        chat_template=template_text(settings.chat_template),
        threads=settings.threads,
        device=settings.device,
        layout=settings.layout,
        kv_cache_mb=settings.kv_cache_mb,
        prefix_cache=settings.prefix_cache,
        batch_window_ms=settings.batch_window_ms,
        max_batch_branches=settings.max_batch_branches,
        max_batch_tokens=settings.max_batch_tokens,
        max_queue=settings.max_queue,
    )


def _remote(settings: Settings) -> Engine:
    """An engine that samples on another server; egrm keeps only the model's tokenizer."""
    from egrm.engines.remote.base import RemoteEngine
    from egrm.engines.remote.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_path(settings), template_text(settings.chat_template))
    timeout_s, max_queue = settings.backend_timeout_s, settings.max_queue
    engine: RemoteEngine
    if settings.engine == "sglang":
        from egrm.engines.sglang import SGLangEngine

        key = settings.sglang_api_key.get_secret_value()
        engine = SGLangEngine(tokenizer, settings.sglang_url, key, timeout_s, max_queue)
    elif settings.engine == "openai":
        from egrm.engines.openai import OpenAIEngine

        key = settings.openai_api_key.get_secret_value()
        engine = OpenAIEngine(
            tokenizer, settings.openai_url, key, settings.openai_model, settings.openai_dialect, timeout_s, max_queue
        )
    else:
        from egrm.engines.llamacpp import LlamaCppEngine

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


POLICY_FILE = "routing_policy.json"


def routing_policy_path(settings: Settings) -> Path | None:
    """Where the judge's routing policy is: EGRM_ROUTING_POLICY, or beside the judge (the shipped
    adapter's folder for the default judge, EGRM_MODEL's folder otherwise); None: route on tau."""
    if settings.routing_policy == "none":
        return None
    if settings.routing_policy:
        return Path(settings.routing_policy).expanduser()
    beside = policy_beside_judge(settings)
    return beside if beside.is_file() else None


def policy_beside_judge(settings: Settings) -> Path:
    """The judge's own policy file (`egrm calibrate` writes it there): in the judge adapter's
    folder, or in EGRM_MODEL's folder when no adapter is merged."""
    adapter = adapter_path(settings)
    folder = adapter if adapter is not None else model_path(settings)
    return (folder if folder.is_dir() else folder.parent) / POLICY_FILE


def routing_policy(settings: Settings) -> RoutingPolicy | None:
    path = routing_policy_path(settings)
    if path is None:
        log.info("routing: tau=%g (no routing policy for this judge)", settings.tau)
        return None
    policy = RoutingPolicy.load(path)
    log.info("routing: %s (%s)", policy.describe(), path)
    return policy


def cluster_limits(settings: Settings) -> ClusterLimits | None:
    """The replicas' shared store (EGRM_SHARE_URL), where question work is shared at all."""
    if settings.share_url is None or not settings.share_questions:
        return None
    return ClusterLimits(
        url=settings.share_url,
        ttl_s=settings.share_ttl_s,
        max_bytes=int(settings.share_max_mb * 2**20),
        lease_s=settings.share_lease_s,
    )


def build_pipeline(settings: Settings, engine: Engine, scorer: Scorer) -> RewardPipeline:
    """The pipeline over an engine and a scorer: math-verify's checker, sharing as the settings
    say (across replicas through Redis where EGRM_SHARE_URL names one), and the judge's routing
    policy."""
    return RewardPipeline(
        engine,
        scorer,
        sharing=sharing_limits(settings),
        policy=routing_policy(settings),
        cluster=cluster_limits(settings),
    )


@asynccontextmanager
async def pipeline_from(
    settings: Settings, engine: Engine | None = None, scorer: Scorer | None = None
) -> AsyncIterator[RewardPipeline]:
    """The pipeline the settings name, for as long as the block runs; what was built here (the
    engine, in a thread: loading a model blocks; the scorer) is closed after it. An engine or a
    scorer passed in belongs to the caller."""
    the_engine = engine if engine is not None else await asyncio.to_thread(build_engine, settings)
    the_scorer = scorer if scorer is not None else build_scorer(settings)
    pipeline = build_pipeline(settings, the_engine, the_scorer)
    try:
        yield pipeline
    finally:
        await pipeline.close()
        if scorer is None:
            await the_scorer.close()
        if engine is None:
            await the_engine.close()
