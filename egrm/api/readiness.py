"""Readiness from cached state: the engine and the scorer are asked in the background, and
/readyz answers what they last said, in microseconds.

Asked per probe, a scorer that accepts TCP and never answers held /readyz for its whole timeout,
longer than Kubernetes' default probe timeout (1 s): every replica behind one hung shared scorer
went NotReady. A check that outlives its timeout counts as a "no".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from egrm.engines.base import Engine
from egrm.pipeline.cluster import ClusterStore
from egrm.pipeline.scorer import Scorer

log = logging.getLogger(__name__)

INTERVAL_S = 2.0  # how often the engine and the scorer are asked
TIMEOUT_S = 1.0  # how long one answer may take


@dataclass(frozen=True, slots=True)
class ReadyState:
    engine: bool
    scorer: bool


async def _answers(check: Awaitable[bool]) -> bool:
    try:
        return bool(await asyncio.wait_for(check, TIMEOUT_S))
    except Exception:  # unreachable, timed out, or failing: not ready
        return False


def _word(ready: bool) -> str:
    return "ready" if ready else "NOT ready"


class ReadinessMonitor:
    def __init__(self, engine: Engine, scorer: Scorer, store: ClusterStore | None = None):
        """store: the replicas' Redis store, asked whether it is back when it failed (it never
        decides readiness: a replica without it judges alone)."""
        self._engine, self._scorer, self._store = engine, scorer, store
        self._task: asyncio.Task[None] | None = None
        self.state = ReadyState(False, False)

    async def start(self) -> None:
        """The first check before the service answers, then one every INTERVAL_S."""
        await self.check()
        self._task = asyncio.create_task(self._watch())

    async def check(self) -> None:
        engine, scorer = await asyncio.gather(_answers(self._engine.ready()), _answers(self._scorer.ready()))
        if self._store is not None:
            with contextlib.suppress(Exception):  # what it said is the store's to tell (/readyz)
                await asyncio.wait_for(self._store.check(), TIMEOUT_S)
        state = ReadyState(engine, scorer)
        if state != self.state:  # a change is news; the same answer every INTERVAL_S is not
            log.info("readiness: engine %s, scorer %s", _word(engine), _word(scorer))
        self.state = state

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL_S)
            await self.check()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
