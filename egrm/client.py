"""Python client for egrm's POST /v1/rewards: sync and async, batching, retries.

    with EgrmClient("http://127.0.0.1:8000") as client:
        results = client.score([{"prompt": "What is 2+2?", "response": "4"}], {"path": "short"})

A long list of items is split into requests of at most `batch_size` items, `concurrency` of them
in flight at once; results come back in input order with `index` counted over the whole list.
429 and 503 are retried with exponential backoff, honouring Retry-After (both capped), and so is a
504 that carries Retry-After (the server keeps the request's work going for its retry); failures
to connect are retried by the transport a bounded number of times; anything else raises.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from egrm.protocol import RewardItem, RewardOptions, RewardResponse, RewardResult

log = logging.getLogger(__name__)

Item = RewardItem | Mapping[str, Any]
Options = RewardOptions | Mapping[str, Any] | None

RETRY_STATUSES = frozenset({429, 503})


def retried(response: httpx.Response) -> bool:
    """Worth sending again: overloaded, unavailable, or past its deadline with the work kept going."""
    return response.status_code in RETRY_STATUSES or (response.status_code == 504 and "retry-after" in response.headers)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 5  # further tries after a 429/503
    backoff_s: float = 0.5  # the first wait without Retry-After; doubles each try
    max_wait_s: float = 30.0  # no single wait is longer, whatever Retry-After says
    connect_retries: int = 3  # further tries to connect (the transport's own, with its backoff)

    def wait_s(self, attempt: int, retry_after: str | None) -> float:
        """Seconds to wait before try attempt+1: the server's Retry-After if it sent one, capped."""
        server = _parse_retry_after(retry_after)
        wait = server if server is not None else self.backoff_s * 2**attempt
        return max(0.0, min(wait, self.max_wait_s))


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:  # the HTTP-date form
        return parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None


class EgrmError(Exception):
    """Base of every error this client raises."""


class EgrmConnectionError(EgrmError):
    """The server could not be reached (after the connect retries) or the connection broke."""


class EgrmTimeoutError(EgrmConnectionError):
    """No answer within the client's timeout."""


class EgrmAPIError(EgrmError):
    """The server refused the request: its status, error type, message and the field it named."""

    def __init__(self, status: int, type: str, message: str, param: str | None, batch_start: int):
        where = f" (the batch starting at item {batch_start})" if batch_start else ""
        super().__init__(f"HTTP {status} {type}: {message}{where}")
        self.status, self.type, self.message, self.param, self.batch_start = status, type, message, param, batch_start


def _api_error(response: httpx.Response, batch_start: int) -> EgrmAPIError:
    try:
        error = response.json()["error"]
        return EgrmAPIError(response.status_code, error["type"], error["message"], error.get("param"), batch_start)
    except (ValueError, KeyError, TypeError):  # not egrm's error shape (a proxy in between, say)
        return EgrmAPIError(response.status_code, "http_error", response.text[:500], None, batch_start)


def _body(items: Sequence[Item], options: Options) -> dict[str, Any]:
    if isinstance(options, RewardOptions):
        opts = options.model_dump(exclude_none=True)
    else:
        opts = dict(options or {})
    wire = [i.model_dump(exclude_none=True) if isinstance(i, RewardItem) else dict(i) for i in items]
    return {"items": wire, "options": opts}


def _batches(items: Sequence[Item], size: int) -> list[tuple[int, Sequence[Item]]]:
    return [(start, items[start : start + size]) for start in range(0, len(items), size)]


def _reindexed(start: int, response: RewardResponse) -> list[RewardResult]:
    return [r.model_copy(update={"index": start + r.index}) for r in response.results]


class _Config:
    def __init__(
        self,
        url: str,
        api_key: str | None,
        timeout_s: float,
        batch_size: int,
        concurrency: int,
        retry: RetryPolicy,
    ):
        if batch_size < 1 or concurrency < 1:
            raise ValueError(f"batch_size and concurrency must be >= 1, got {batch_size} and {concurrency}")
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self.batch_size, self.concurrency, self.retry = batch_size, concurrency, retry


class EgrmClient:
    """Blocking client; batches run on `concurrency` threads over one connection pool."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        batch_size: int = 64,
        concurrency: int = 4,
        retry: RetryPolicy | None = None,
    ):
        self._cfg = _Config(url, api_key, timeout_s, batch_size, concurrency, retry or RetryPolicy())
        self._http = httpx.Client(
            base_url=self._cfg.url,
            headers=self._cfg.headers,
            timeout=self._cfg.timeout,
            transport=httpx.HTTPTransport(retries=self._cfg.retry.connect_retries),
        )

    def score(self, items: Sequence[Item], options: Options = None) -> list[RewardResult]:
        """One result per item, in order."""
        batches = _batches(items, self._cfg.batch_size)
        if len(batches) <= 1 or self._cfg.concurrency == 1:
            return [r for start, batch in batches for r in self._post(start, batch, options)]
        with ThreadPoolExecutor(min(self._cfg.concurrency, len(batches)), thread_name_prefix="egrm-client") as pool:
            futures = [pool.submit(self._post, start, batch, options) for start, batch in batches]
            try:
                return [r for f in futures for r in f.result()]
            except BaseException:
                for f in futures:  # do not send batches nobody will read
                    f.cancel()
                raise

    def _post(self, start: int, batch: Sequence[Item], options: Options) -> list[RewardResult]:
        body = _body(batch, options)
        for attempt in range(self._cfg.retry.max_retries + 1):
            try:
                response = self._http.post("/v1/rewards", json=body)
            except httpx.TimeoutException as exc:
                raise EgrmTimeoutError(f"no answer from {self._cfg.url} within the timeout: {exc}") from exc
            except httpx.TransportError as exc:
                raise EgrmConnectionError(f"cannot reach {self._cfg.url}: {exc}") from exc
            if retried(response) and attempt < self._cfg.retry.max_retries:
                wait = self._cfg.retry.wait_s(attempt, response.headers.get("retry-after"))
                log.warning("egrm answered %d; retry %d in %.2fs", response.status_code, attempt + 1, wait)
                time.sleep(wait)
                continue
            if response.is_success:
                return _reindexed(start, RewardResponse.model_validate_json(response.content))
            raise _api_error(response, start)
        raise AssertionError("unreachable: the last try returns or raises")

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EgrmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEgrmClient:
    """asyncio client; at most `concurrency` batches in flight at once."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        batch_size: int = 64,
        concurrency: int = 4,
        retry: RetryPolicy | None = None,
    ):
        self._cfg = _Config(url, api_key, timeout_s, batch_size, concurrency, retry or RetryPolicy())
        self._http = httpx.AsyncClient(
            base_url=self._cfg.url,
            headers=self._cfg.headers,
            timeout=self._cfg.timeout,
            transport=httpx.AsyncHTTPTransport(retries=self._cfg.retry.connect_retries),
        )

    async def score(self, items: Sequence[Item], options: Options = None) -> list[RewardResult]:
        """One result per item, in order."""
        gate = asyncio.Semaphore(self._cfg.concurrency)

        async def one(start: int, batch: Sequence[Item]) -> list[RewardResult]:
            async with gate:
                return await self._post(start, batch, options)

        tasks = [asyncio.ensure_future(one(start, batch)) for start, batch in _batches(items, self._cfg.batch_size)]
        try:
            done = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [r for results in done for r in results]

    async def _post(self, start: int, batch: Sequence[Item], options: Options) -> list[RewardResult]:
        body = _body(batch, options)
        for attempt in range(self._cfg.retry.max_retries + 1):
            try:
                response = await self._http.post("/v1/rewards", json=body)
            except httpx.TimeoutException as exc:
                raise EgrmTimeoutError(f"no answer from {self._cfg.url} within the timeout: {exc}") from exc
            except httpx.TransportError as exc:
                raise EgrmConnectionError(f"cannot reach {self._cfg.url}: {exc}") from exc
            if retried(response) and attempt < self._cfg.retry.max_retries:
                wait = self._cfg.retry.wait_s(attempt, response.headers.get("retry-after"))
                log.warning("egrm answered %d; retry %d in %.2fs", response.status_code, attempt + 1, wait)
                await asyncio.sleep(wait)
                continue
            if response.is_success:
                return _reindexed(start, RewardResponse.model_validate_json(response.content))
            raise _api_error(response, start)
        raise AssertionError("unreachable: the last try returns or raises")

    async def ready(self) -> bool:
        try:
            return (await self._http.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncEgrmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
