"""Every Prometheus object of the service, on one registry per app (tests build many apps)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from egrm.engines.base import EngineStats
from egrm.gpu_monitor import GpuReading
from egrm.pipeline.cluster import ClusterStats
from egrm.pipeline.sharing import SharingStats

__all__ = ["CONTENT_TYPE", "Metrics", "WorkerMetrics"]

# The *_created series double the output and no dashboard of ours reads them.
disable_created_metrics()

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)
# A scorer call is milliseconds for the heuristic, tens of ms for a small model.
_WORKER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_CONSENSUS_BUCKETS = tuple(i / 10 for i in range(1, 11))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_latency = Histogram(
            "egrm_request_latency_seconds",
            "Request latency by endpoint and route (mixed: items of more than one route).",
            ["endpoint", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.routes = Counter("egrm_route_total", "Items answered, by route.", ["route"], registry=r)
        self.consensus = Histogram(
            "egrm_consensus", "Consensus of the answer-only samples per item.", buckets=_CONSENSUS_BUCKETS, registry=r
        )
        self.stage_latency = Histogram(
            "egrm_stage_latency_seconds",
            "Per-item stage latency (sample, reasoning, scorer).",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("egrm_prompt_tokens_total", "Prompt tokens of all branches.", registry=r)
        self.cached_prompt_tokens = Counter(
            "egrm_cached_prompt_tokens_total", "Prompt tokens served from the shared prefix cache.", registry=r
        )
        self.completion_tokens = Counter("egrm_completion_tokens_total", "Tokens generated.", registry=r)
        self.item_errors = Counter("egrm_item_errors_total", "Items answered with an error.", registry=r)
        self.scorer_fallbacks = Counter(
            "egrm_scorer_fallback_total", "Long-path items degraded to a vote: the scorer failed.", registry=r
        )
        self.in_flight = Gauge("egrm_requests_in_flight", "Requests being served.", registry=r)
        self.cancelled = Counter(
            "egrm_cancelled_requests_total", "Requests whose work was cancelled, by reason.", ["reason"], registry=r
        )

    def watch_engine(self, stats: Callable[[], EngineStats]) -> None:
        """Read the engine's counters at every scrape (they live on the model thread)."""
        self.registry.register(_EngineCollector(stats))

    def watch_sharing(self, stats: Callable[[], SharingStats]) -> None:
        """Read the shared question store's counters at every scrape."""
        self.registry.register(_SharingCollector(stats))

    def watch_cluster(self, stats: Callable[[], ClusterStats]) -> None:
        """Read the replicas' Redis store's counters at every scrape."""
        self.registry.register(_ClusterCollector(stats))

    def watch_gpus(self, latest: Callable[[], list[GpuReading]]) -> None:
        """Export the GPU monitor's latest reading at every scrape (the monitor's thread calls NVML)."""
        self.registry.register(_GpuCollector(latest))

    def observe_item(
        self, route: str | None, consensus: float, stages_ms: dict[str, float], degraded: bool, error: bool
    ) -> None:
        if error:
            self.item_errors.inc()
        if route is None:
            return
        self.routes.labels(route=route).inc()
        self.consensus.observe(consensus)
        for stage, ms in stages_ms.items():
            if ms > 0:
                self.stage_latency.labels(stage=stage).observe(ms / 1000)
        if degraded:
            self.scorer_fallbacks.inc()

    def observe_tokens(self, prompt: int, cached: int, completion: int) -> None:
        self.prompt_tokens.inc(prompt)
        self.cached_prompt_tokens.inc(cached)
        self.completion_tokens.inc(completion)

    def observe_request(self, endpoint: str, routes: set[str], seconds: float) -> None:
        route = routes.pop() if len(routes) == 1 else ("mixed" if routes else "none")
        self.request_latency.labels(endpoint=endpoint, route=route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WorkerMetrics:
    """The scorer worker's own series (its process, its registry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "egrm_scorer_worker_requests_total", "POST /v1/score requests, by HTTP status.", ["status"], registry=r
        )
        self.latency = Histogram(
            "egrm_scorer_worker_request_latency_seconds",
            "POST /v1/score latency, validation and scoring included.",
            buckets=_WORKER_BUCKETS,
            registry=r,
        )
        self.candidates = Counter("egrm_scorer_worker_candidates_total", "Candidates scored.", registry=r)

    def observe_request(self, status: int, seconds: float) -> None:
        self.requests.labels(status=str(status)).inc()
        self.latency.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats]):
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        s = self._stats()
        counters = {
            "egrm_engine_batches": ("Engine steps (one forward each).", s.batches),
            "egrm_engine_batched_requests": (
                "Engine jobs (sample or continue calls) taken.",
                s.batched_requests,
            ),
            "egrm_engine_batched_branches": ("Branches in those jobs.", s.batched_branches),
            "egrm_engine_decode_steps": (
                "Engine steps that decoded (a step may also compute prompt chunks).",
                s.decode_steps,
            ),
            "egrm_prefix_cache_hit_tokens": ("Prompt tokens served from the prefix cache.", s.prefix_cache_hit_tokens),
            "egrm_engine_gc_released": (
                "Branches whose KV the garbage collector freed: their caller never released them (a safety net).",
                s.gc_released,
            ),
            "egrm_engine_background_steps": (
                "Engine steps that computed work nobody waits for (question work in its grace).",
                s.background_steps,
            ),
            "egrm_engine_background_tokens": ("Tokens those steps computed for it.", s.background_tokens),
            "egrm_engine_spare_tokens": (
                "Tokens computed for spare work (the long path's spare candidates) in rows a step had to spare.",
                s.spare_tokens,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily("egrm_engine_queue_depth", "Jobs waiting for the model thread.", value=s.queue_depth)
        yield GaugeMetricFamily(
            "egrm_engine_kv_bytes", "KV pool in use by running and held branches (embedded engine).", value=s.kv_bytes
        )
        yield GaugeMetricFamily(
            "egrm_engine_kv_capacity_bytes",
            "KV pool size (embedded engine, EGRM_KV_CACHE_MB).",
            value=s.kv_capacity_bytes,
        )


class _SharingCollector(Collector):
    def __init__(self, stats: Callable[[], SharingStats]):
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        s = self._stats()
        outcomes = CounterMetricFamily(
            "egrm_shared_questions",
            "Items' question work by how they got it: hit (finished work read), join (running work "
            "awaited), miss (work started).",
            labels=["outcome"],
        )
        for outcome, value in (("hit", s.hits), ("join", s.joins), ("miss", s.misses)):
            outcomes.add_metric([outcome], value)
        yield outcomes
        yield CounterMetricFamily(
            "egrm_shared_questions_refused",
            "Requests refused new question work (429): it would not finish before their deadline.",
            value=s.refused,
        )
        yield CounterMetricFamily(
            "egrm_shared_questions_dropped",
            "Question work stopped at the end of its grace: nobody came back for it.",
            value=s.dropped,
        )
        yield GaugeMetricFamily(
            "egrm_shared_questions_orphaned",
            "Question work running that nobody waits for (its grace after a deadline): background work.",
            value=s.orphaned,
        )
        yield GaugeMetricFamily("egrm_shared_questions_entries", "Finished question work kept.", value=s.entries)
        yield GaugeMetricFamily("egrm_shared_questions_bytes", "Size of the question work kept.", value=s.bytes)
        yield GaugeMetricFamily("egrm_shared_questions_running", "Question work running.", value=s.running)


class _ClusterCollector(Collector):
    def __init__(self, stats: Callable[[], ClusterStats]):
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        s = self._stats()
        outcomes = CounterMetricFamily(
            "egrm_shared_store",
            "Question work this replica's window did not hold, by how the replicas' Redis store gave it: hit "
            "(finished work read), wait (another replica's work awaited), computed (here, under the question's "
            "lock), takeover (of computed: the lock taken after waiting, its holder gone), local (Redis did not "
            "answer: computed here alone).",
            labels=["outcome"],
        )
        for outcome, value in (
            ("hit", s.hits),
            ("wait", s.waits),
            ("computed", s.computed),
            ("takeover", s.takeovers),
            ("local", s.local),
        ):
            outcomes.add_metric([outcome], value)
        yield outcomes
        yield CounterMetricFamily("egrm_shared_store_calls", "Redis calls made (the store's traffic).", value=s.calls)
        yield CounterMetricFamily("egrm_shared_store_errors", "Redis calls that failed.", value=s.errors)
        yield GaugeMetricFamily(
            "egrm_shared_store_degraded",
            "1 while Redis fails: this replica judges on its own (EGRM_SHARE_URL).",
            value=float(s.degraded),
        )


class _GpuCollector(Collector):
    def __init__(self, latest: Callable[[], list[GpuReading]]):
        self._latest = latest

    def collect(self) -> Iterable[Metric]:
        gpus = self._latest()
        if not gpus:
            return  # no GPU: no families at all, not empty ones
        labels = ["gpu", "name"]
        util = GaugeMetricFamily("egrm_gpu_utilization_percent", "GPU busy time, percent (NVML).", labels=labels)
        used = GaugeMetricFamily("egrm_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=labels)
        total = GaugeMetricFamily("egrm_gpu_memory_total_bytes", "GPU memory installed (NVML).", labels=labels)
        for g in gpus:
            values = [str(g.index), g.name]
            util.add_metric(values, g.utilization_percent)
            used.add_metric(values, g.memory_used_bytes)
            total.add_metric(values, g.memory_total_bytes)
        yield from (util, used, total)
