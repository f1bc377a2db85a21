"""HttpScorer: the Scorer protocol over HTTP to the scorer worker, with a deadline and bounded retries.

Whatever goes wrong ends in a raised ScorerError; the long path then degrades to the candidates'
majority (degraded: true), so a slow or dead worker costs quality, never the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence

import httpx
from pydantic import ValidationError

from egrm.pipeline.scorer import Candidate
from egrm.scorer.wire import ScoreResponse

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 1.0  # a probe must answer fast: /readyz of the API waits on it


class ScorerError(RuntimeError):
    """The worker gave no usable scores."""


class HttpScorer:
    def __init__(self, url: str, timeout_s: float = 5.0, retries: int = 1, backoff_s: float = 0.2):
        self.url = url.rstrip("/")
        self._timeout_s, self._retries, self._backoff_s = timeout_s, retries, backoff_s
        self._client = httpx.AsyncClient(base_url=self.url, timeout=timeout_s)
        # What the worker last said of its scores (each answer and /readyz say it). Until it has
        # answered, taken as the shipped worker's (trained); the answer that says otherwise comes
        # before early stop reads its scores, so a heuristic worker never stops a long path early.
        self.calibrated = True

    async def score(self, candidates: Sequence[Candidate]) -> list[float]:
        """Scores in order; one attempt plus `retries` on a connection error, a timeout or a 5xx."""
        body = {"candidates": [dataclasses.asdict(c) for c in candidates]}
        attempts, failure = self._retries + 1, ""
        for attempt in range(attempts):
            try:
                # httpx's timeout bounds each read; wait_for bounds the whole call (a worker that
                # trickles bytes cannot hold the long path past the deadline).
                response = await asyncio.wait_for(self._client.post("/v1/score", json=body), self._timeout_s)
            except (httpx.TransportError, asyncio.TimeoutError) as exc:
                failure = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if response.status_code < 500:
                    return self._scores(response, len(candidates))
                failure = f"HTTP {response.status_code}"
            if attempt + 1 < attempts:
                log.info("scorer attempt %d/%d failed (%s); retrying", attempt + 1, attempts, failure)
                await asyncio.sleep(self._backoff_s * 2**attempt)
        raise ScorerError(f"scorer worker at {self.url} failed {attempts} attempt(s); last: {failure}")

    def _scores(self, response: httpx.Response, expected: int) -> list[float]:
        """A 2xx with one score per candidate, or an error that says why not (4xx are not retried)."""
        if response.status_code != 200:
            raise ScorerError(f"scorer worker refused the candidates: HTTP {response.status_code}: {response.text}")
        try:
            answer = ScoreResponse.model_validate_json(response.content)
        except ValidationError as exc:
            raise ScorerError(f"scorer worker sent an unreadable answer: {exc}") from exc
        scores = answer.scores
        self._said(answer.calibrated, answer.scorer)
        if len(scores) != expected:
            raise ScorerError(f"scorer worker sent {len(scores)} scores for {expected} candidates")
        return scores

    async def ready(self) -> bool:
        try:
            response = await self._client.get("/readyz", timeout=min(_READY_TIMEOUT_S, self._timeout_s))
        except httpx.HTTPError:
            return False
        with contextlib.suppress(ValueError, AttributeError):
            self._said(bool(response.json().get("calibrated", False)), "its scorer")
        return response.status_code == 200

    def _said(self, calibrated: bool, scorer: str) -> None:
        if self.calibrated and not calibrated:
            log.warning(
                "the scorer worker at %s scores with %s, whose score is not a probability of being right: "
                "the long path does not stop early on it (every candidate reasons to the end)",
                self.url,
                scorer,
            )
        self.calibrated = calibrated

    async def close(self) -> None:
        await self._client.aclose()
