"""Work shared by key: computed once, joined while it runs, kept for a bounded window afterwards.

RLHF trainers send G responses to one question at once (GRPO, RLOO, DAPO), often one POST each.
The judge's costly work depends on the question alone, so the pipeline keys it by what decides it
and asks this store for it:

- **single flight**: the first request starts the work; every request that needs it while it
  runs awaits the same task (shielded: one waiter's deadline or disconnect never cancels it for
  the others);
- **grace**: when the last waiter leaves because its deadline passed, the work goes on for
  `grace_s` more, so a trainer's retry of the same query joins it instead of starting over; nobody
  back by then, it is cancelled. Meanwhile it is background work (`waited` is false): the engine
  runs it only with what live requests leave of a step, and admission does not count it. A
  waiter that goes away otherwise (its client disconnected) leaves nothing running for nobody:
  with no other waiter, the work is cancelled at once;
- **a bounded window**: finished work is kept, least recently used first out, within `max_entries`,
  `max_bytes` (as `size_of` counts them) and `ttl_s`; a failure, or work `keep` turns down (a
  degraded result), is never kept;
- **leases**: work taken with `lease` is in use until the block ends; work that has left the
  window (or never entered it) is handed to `release` once nobody uses it, so what it holds
  outside Python (the engine's KV for its branches) goes back explicitly, not when the garbage
  collector gets to it;
- **admission**: a request that would start new work is refused (OverloadedError) when its own
  work, at its fair share of the engine, would not finish before the deadline the request brings
  plus the grace: egrm never accepts work it expects to throw away, and one request's backlog
  never has another refused.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cachetools import TTLCache

from egrm.aio import DEADLINE
from egrm.pipeline.types import Shared

V = TypeVar("V")

# Admission estimates the store's throughput from the last _RATE_WORKS works finished, over the
# time work was running (idle time would make it look slow); with fewer than _MIN_FINISHED it
# has no estimate and admits.
_RATE_WORKS = 32
_MIN_FINISHED = 4


class OverloadedError(RuntimeError):
    """New work would not finish before the request's deadline (HTTP 429 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class SharingLimits:
    """The store's bounds (EGRM_SHARE_*)."""

    max_entries: int = 4096
    max_bytes: int = 64 * 2**20
    ttl_s: float = 600.0
    grace_s: float = 30.0


@dataclass(slots=True)
class SharingStats:
    """What metrics.py exports (plain numbers; the store fills them)."""

    hits: int = 0  # finished work read from the window
    joins: int = 0  # running work joined
    misses: int = 0  # work started
    refused: int = 0  # new work refused: it would not finish in time
    entries: int = 0  # finished works kept (a reading)
    bytes: int = 0  # their size (a reading)
    running: int = 0  # works running (a reading)
    orphaned: int = 0  # of those, works nobody waits for: in their grace after a deadline (a reading)
    dropped: int = 0  # works stopped at the end of their grace, nobody back for them


class _Window(TTLCache):
    """The kept work: a TTLCache that says what leaves it (evicted or expired)."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float], getsizeof: Callable, left: Callable):
        super().__init__(maxsize=maxsize, ttl=ttl, timer=timer, getsizeof=getsizeof)
        self._left = left

    def popitem(self):  # type: ignore[no-untyped-def]
        key, value = super().popitem()
        self._left(value)
        return key, value

    def expire(self, time=None):  # type: ignore[no-untyped-def]
        gone = super().expire(time)
        for _, value in gone:
            self._left(value)
        return gone


@dataclass(eq=False, slots=True)
class _Flight(Generic[V]):
    task: asyncio.Task[V]
    owner: object = None  # the request that started it (admission shares the engine among requests)
    waiters: int = 0
    grace_until: float | None = None  # the loop time its grace after a deadline ends
    reaper: asyncio.TimerHandle | None = field(default=None, repr=False)


class SharedWork(Generic[V]):
    def __init__(
        self,
        limits: SharingLimits,
        size_of: Callable[[V], int],
        keep: Callable[[V], bool] = lambda _: True,
        release: Callable[[V], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limits = limits
        self._worth_keeping = keep
        self._release = release
        self._clock = clock
        self._done: TTLCache[Hashable, V] = _Window(limits.max_bytes, limits.ttl_s, clock, size_of, self._out_of_window)
        self._uses: Counter[int] = Counter()  # id(value) -> leases open on it
        self._gone: dict[int, V] = {}  # work out of the window, still leased
        self._size_of = size_of
        self._flights: dict[Hashable, _Flight[V]] = {}
        # Admission's rate: a clock that runs only while work runs, read as each work finishes.
        self._busy_s = 0.0
        self._busy_from: float | None = None
        self._finished: deque[float] = deque(maxlen=_RATE_WORKS)
        self._stats = SharingStats()

    async def get(
        self,
        key: Hashable,
        compute: Callable[[], Awaitable[V]],
        deadline_s: float | None = None,
        owner: object = None,
    ) -> tuple[V, Shared]:
        """The work for key: read from the window, joined while it runs, or started here. A request
        (owner) that brings a deadline is refused new work it would not see finish (OverloadedError)."""
        done = self._done.get(key)
        if done is not None:
            self._stats.hits += 1
            return done, Shared.CACHED
        flight = self._flights.get(key)
        how = Shared.JOINED
        if flight is None:
            self._admit(deadline_s, owner)
            flight = self._start(key, compute, owner)
            how = Shared.COMPUTED
        else:
            self._stats.joins += 1
        flight.waiters += 1
        if flight.reaper is not None:
            flight.reaper.cancel()
            flight.reaper = None
        try:
            value = await asyncio.shield(flight.task)
        except asyncio.CancelledError as exc:  # this waiter stops waiting; the work is not its alone
            self._left(key, flight, at_deadline=DEADLINE in exc.args)
            raise
        except BaseException:
            flight.waiters -= 1
            raise
        flight.waiters -= 1
        return value, how

    @asynccontextmanager
    async def lease(
        self,
        key: Hashable,
        compute: Callable[[], Awaitable[V]],
        deadline_s: float | None = None,
        owner: object = None,
    ) -> AsyncIterator[tuple[V, Shared]]:
        """get(), with the work in use until the block ends (then released, if it is not kept)."""
        value, how = await self.get(key, compute, deadline_s, owner)
        self._uses[id(value)] += 1
        try:
            yield value, how
        finally:
            self._uses[id(value)] -= 1
            if not self._uses[id(value)]:
                del self._uses[id(value)]
                if self._done.get(key) is not value:  # left the window, or never entered it
                    self._gone.pop(id(value), None)
                    self._release(value)

    def _out_of_window(self, value: V) -> None:
        """value left the window: released now, or when its last lease ends."""
        if self._uses[id(value)]:
            self._gone[id(value)] = value
        else:
            self._uses.pop(id(value), None)
            self._release(value)

    def waited(self, key: Hashable) -> bool:
        """Whether a request still waits for the work running for key (False in its grace: work
        nobody waits for; the engine runs it only in its idle time). Read from the engine's thread."""
        flight = self._flights.get(key)
        return flight is None or flight.waiters > 0

    def refresh(self, key: Hashable, value: V) -> None:
        """value grew after it was kept (responses' verdicts memoised on it): count its new size."""
        if key in self._done:
            self._keep(key, value)

    def stats(self) -> SharingStats:
        self._done.expire()
        self._stats.entries, self._stats.bytes = len(self._done), int(self._done.currsize)
        self._stats.running = len(self._flights)
        self._stats.orphaned = sum(1 for f in self._flights.values() if not f.waiters)
        return self._stats

    # --- inside ---------------------------------------------------------------------------

    def _start(self, key: Hashable, compute: Callable[[], Awaitable[V]], owner: object) -> _Flight[V]:
        self._stats.misses += 1
        # The task runs in the starting request's context (its fairness tag in the engine).
        flight: _Flight[V] = _Flight(asyncio.ensure_future(compute()), owner)
        if not self._flights:
            self._busy_from = self._clock()
        self._flights[key] = flight
        flight.task.add_done_callback(lambda task: self._landed(key, flight, task))
        return flight

    def _landed(self, key: Hashable, flight: _Flight[V], task: asyncio.Task[V]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
            if not self._flights and self._busy_from is not None:
                self._busy_s += self._clock() - self._busy_from
                self._busy_from = None
        if flight.reaper is not None:
            flight.reaper.cancel()
        if task.cancelled() or task.exception() is not None:
            return  # a failure is the waiters' alone: the next request starts anew
        self._finished.append(self._busy_clock())
        value = task.result()
        if self._worth_keeping(value):
            self._keep(key, value)
        elif not flight.waiters:  # not kept, and nobody is about to lease it
            self._release(value)

    def _keep(self, key: Hashable, value: V) -> None:
        if self.limits.max_entries == 0 or self._size_of(value) > self.limits.max_bytes:
            left = self._done.pop(key, None)
            if left is not None:
                self._out_of_window(left)
            return
        self._done[key] = value  # evicts the least recently used past max_bytes
        while len(self._done) > self.limits.max_entries:
            self._done.popitem()

    def _left(self, key: Hashable, flight: _Flight[V], at_deadline: bool) -> None:
        """A waiter stopped waiting. The last one: the work goes on through the grace after a
        deadline (its own, or an earlier waiter's not yet over), and is stopped otherwise."""
        flight.waiters -= 1
        if flight.waiters or flight.task.done():
            return
        loop = asyncio.get_running_loop()
        if at_deadline:
            flight.grace_until = loop.time() + self.limits.grace_s
        if flight.grace_until is not None and flight.grace_until > loop.time():
            flight.reaper = loop.call_at(flight.grace_until, self._reap, key, flight)
        else:
            flight.task.cancel()

    def _reap(self, key: Hashable, flight: _Flight[V]) -> None:
        """The grace is over and nobody waits: stop the work."""
        if flight.waiters == 0 and not flight.task.done():
            self._stats.dropped += 1
            flight.task.cancel()

    def _busy_clock(self) -> float:
        """Seconds during which some work was running, since the store began."""
        running = self._clock() - self._busy_from if self._busy_from is not None else 0.0
        return self._busy_s + running

    def _admit(self, deadline_s: float | None, owner: object) -> None:
        """Refuse new work that would not finish before the request's deadline plus the grace
        (after which nobody would read it). The engine shares its steps fairly among requests, so
        a request's work waits for its own work ahead of it, at its share of the rate: n works of
        its own among r requests take about (n + 1) * r / rate. Work nobody waits for does not
        count (it runs behind every live request), nor does another request's backlog: one
        request cannot have the others refused."""
        live = [f for f in self._flights.values() if f.waiters]
        if deadline_s is None or len(self._finished) < _MIN_FINISHED or not live:
            return
        busy = self._busy_clock() - self._finished[0]
        rate = (len(self._finished) - 1) / max(busy, 1e-3)  # works finished per second of work
        mine = sum(1 for f in live if f.owner is owner)
        requests = len({id(f.owner) for f in live} | {id(owner)})
        expected_s = (mine + 1) * requests / rate
        horizon_s = deadline_s + self.limits.grace_s
        if expected_s > horizon_s:
            self._stats.refused += 1
            raise OverloadedError(
                f"overloaded: this request's {mine + 1} questions, sharing the engine with {requests - 1} other "
                f"requests, would take about {expected_s:.0f} s at the current {rate:.2f} questions/s, more than "
                f"its deadline plus EGRM_SHARE_GRACE_S ({horizon_s:g} s); retry later",
                retry_after_s=math.ceil(expected_s - horizon_s),
            )
