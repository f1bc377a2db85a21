"""Question work shared by egrm's replicas through Redis: each question judged once per cluster.

A trainer's group of responses to one question reaches several replicas (veRL spreads samples
over its reward workers; OpenRLHF's retries land wherever the Service sends them). Each replica
keeps its own window of question work (sharing.py); with EGRM_SHARE_URL set, what its window does
not hold it asks this store for, before computing:

- **finished work** is read from Redis (`<namespace>:q:<key>`, kept ttl_s; the bytes are bounded
  by Redis's own `maxmemory` with `allkeys-lru`, as the deployments set it);
- **single flight across replicas**: the replica that takes the question's lock
  (`<namespace>:lock:<key>`, a lease of lease_s it renews while it works) computes; the others wait
  for its result (told by pub/sub when it is stored, polling besides), and take the lock over when
  it lapses (the replica died) or is given back with no result (its work failed, or was stopped for
  nobody). A replica busy with other questions lets its live peers take a new one first;
- **one result**: the first one written stands (SET NX). A question's samples are seeded from its
  key (service.py), so a replica that computed it too (its lock lapsed under it) drew the same
  samples: the same reward, to the last digits batch composition moves;
- **degraded, never down**: when Redis does not answer, the replica judges on its own (its window
  still shares work among its own requests), counts it, says so in /readyz, and asks Redis again
  after retry_s. Work it could not store is still served; nothing waits on Redis for long
  (socket timeouts of a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from redis.asyncio import Redis
from redis.asyncio.lock import Lock
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import LockError, RedisError

from egrm.pipeline.types import Shared

log = logging.getLogger(__name__)

V = TypeVar("V")
T = TypeVar("T")

# A replica waiting for another's work is told when it is stored or given up (Redis pub/sub, one
# subscription per replica) and looks again at once; it also looks every poll, 5 ms first,
# doubling to every second (a message lost, a holder that died and whose lock lapsed): about two
# calls a second per waiting question, where polling every 100 ms cost twenty.
_FIRST_POLL_S = 0.005
_MAX_POLL_S = 1.0
_TIMEOUT_S = 1.0  # what one Redis call may take before the replica judges on its own
# A replica computing n questions lets its peers take a new one first: it waits n x _YIELD_S (at
# most _MAX_YIELD_S) from its first read that found no result before it takes the lock, polling
# for a result meanwhile and looking again when the wait ends. A burst of questions that reach
# every replica (a step's groups split between them) then spreads over the replicas instead of
# going to whichever asks first (measured: one of two computed all 16). A replica with no live
# peer never waits; one with peers pays at most that wait (and a read), and only under load.
_YIELD_S = 0.01
_MAX_YIELD_S = 0.1
# Each replica says it is alive in a sorted set (member: its id, score: when that stops being
# true), every time the readiness monitor checks (2 s); its peers are the others not yet expired.
_ALIVE_S = 10.0


@dataclass(frozen=True, slots=True)
class ClusterLimits:
    """EGRM_SHARE_URL and its timings."""

    url: str
    ttl_s: float = 600.0  # finished work's age bound (EGRM_SHARE_TTL_S)
    max_bytes: int = 64 * 2**20  # work larger than this is not stored (EGRM_SHARE_MAX_MB)
    lease_s: float = 10.0  # how long a question's lock outlives a replica that died holding it
    retry_s: float = 5.0  # how long a replica that lost Redis judges on its own before asking again
    namespace: str = "egrm"


@dataclass(slots=True)
class ClusterStats:
    """What metrics.py exports."""

    hits: int = 0  # finished work read from Redis
    waits: int = 0  # work another replica was computing, awaited to its end
    computed: int = 0  # work this replica computed under the question's lock
    takeovers: int = 0  # of those, locks taken after waiting: the holder died, failed or gave up
    local: int = 0  # work computed without Redis (it did not answer)
    errors: int = 0  # Redis calls that failed
    calls: int = 0  # Redis calls made (the store's traffic)
    degraded: bool = False  # Redis did not answer lately: this replica judges on its own


class ClusterStore(Generic[V]):
    def __init__(
        self,
        limits: ClusterLimits,
        encode: Callable[[V], bytes],
        keep: Callable[[V], bool] = lambda _: True,
        redis: Redis | None = None,
    ):
        """encode: a value as stored (decode is the caller's, per call: what a replica rebuilds
        from the bytes depends on its request); keep: whether a finished value is stored at all
        (degraded work is not)."""
        self.limits = limits
        # One quick retry (a pooled connection that a Redis restart broke reconnects), no backoff:
        # redis-py's default backs off for seconds, which a replica would spend before judging alone.
        self._redis = redis or Redis.from_url(
            limits.url,
            socket_timeout=_TIMEOUT_S,
            socket_connect_timeout=_TIMEOUT_S,
            retry=Retry(NoBackoff(), 1),
        )
        self._encode, self._keep = encode, keep
        self._stats = ClusterStats()
        self._down_until = 0.0
        self._why = ""
        self._later: set[asyncio.Task[object]] = set()  # locks given back after a cancel
        self._computing = 0  # questions this replica claims or computes under their lock now
        self._id = uuid.uuid4().hex
        self._news: dict[str, asyncio.Event] = {}  # result name -> its waiter's wake-up
        self._listener: asyncio.Task[None] | None = None
        self._peers = 0  # other replicas alive on this store, as last read (check())

    async def get(
        self, key: bytes, compute: Callable[[], Awaitable[V]], decode: Callable[[bytes, Shared], V]
    ) -> tuple[V, Shared]:
        """The work for key: read from Redis, awaited while another replica computes it, or
        computed here under its lock (or on this replica alone, while Redis does not answer).
        decode(bytes, how) rebuilds stored work: CACHED (finished before this call) or JOINED
        (another replica finished it while this one waited)."""
        if time.monotonic() < self._down_until:  # Redis failed within retry_s: not asked again yet
            return await self._alone(compute)
        if self._listener is None:
            self._listener = asyncio.ensure_future(self._listen())
        result, lock = self._names(key)
        waited, refused, poll = False, False, _FIRST_POLL_S
        # The yield runs from the first read that found no result, not from the call: the time a
        # read takes (new connections, a busy Redis) is not time yielded.
        missing_since = math.inf
        while True:
            wait_s = poll
            try:
                data = cast("bytes | None", await self._call(self._redis.get(result)))
                if data is None:
                    missing_since = min(missing_since, time.monotonic())
                    yield_s = min(self._computing * _YIELD_S, _MAX_YIELD_S) if self._peers else 0.0
                    left_s = missing_since + yield_s - time.monotonic()
                    if left_s > 0:  # yielding to the peers: look again when the yield ends, not later
                        wait_s = min(poll, left_s)
                    else:
                        self._computing += 1  # from the claim to the end of its work: a burst's next claim yields
                        try:
                            claimed = await self._claim(result, lock)
                            if isinstance(claimed, Lock):
                                self._stats.takeovers += refused
                                return await self._compute(result, claimed, compute), Shared.COMPUTED
                        finally:
                            self._computing -= 1
                        data, refused = claimed, True
            except RedisError as exc:
                self._down(exc)
                return await self._alone(compute)
            if data is not None:
                how = Shared.JOINED if waited else Shared.CACHED
                self._count(how)
                return decode(data, how), how
            waited = True
            await self._news_of(result, wait_s)
            poll = min(2 * poll, _MAX_POLL_S)

    @property
    def degraded(self) -> bool:
        """Whether Redis failed and has not answered since (this replica judges on its own, and
        asks Redis again every retry_s)."""
        return bool(self._why)

    async def check(self) -> None:
        """Say this replica is alive and count its live peers; ask a Redis that failed whether it
        is back once retry_s is over. The readiness monitor calls this every few seconds, so
        /readyz tells even when no request has asked Redis."""
        if time.monotonic() < self._down_until:
            return
        now, alive = time.time(), f"{self.limits.namespace}:replicas"
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.zadd(alive, {self._id: now + _ALIVE_S})
                pipe.zremrangebyscore(alive, "-inf", now)
                pipe.zcard(alive)
                *_, count = await self._call(pipe.execute())
            self._peers = max(0, int(count) - 1)
        except RedisError as exc:
            self._down(exc)

    @property
    def peers(self) -> int:
        """Other replicas alive on this store, as last read (check())."""
        return self._peers

    def describe(self) -> str:
        """For /readyz: the store, and why it is degraded."""
        return f"redis: degraded ({self._why})" if self.degraded else "redis"

    def stats(self) -> ClusterStats:
        self._stats.degraded = self.degraded
        return self._stats

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        await asyncio.gather(*self._later, *filter(None, [self._listener]), return_exceptions=True)
        with contextlib.suppress(RedisError):  # leaving: its peers stop yielding to it at once
            await self._redis.zrem(f"{self.limits.namespace}:replicas", self._id)
        await self._redis.aclose()

    # --- inside ---------------------------------------------------------------------------

    async def _claim(self, result: str, lock: str) -> Lock | bytes | None:
        """Take the question's lock: the lock when the work is this replica's to compute, the stored
        work when another replica stored it between the read and the lock, None when another holds it."""
        owner = self._redis.lock(lock, timeout=self.limits.lease_s, blocking=False)
        if not await self._call(owner.acquire()):
            return None
        try:
            data = cast("bytes | None", await self._call(self._redis.get(result)))
        except BaseException:
            self._give_back(owner, result)  # a failed or stopped read does not hold the lock for lease_s
            raise
        if data is None:
            return owner
        self._give_back(owner, result)
        return data

    async def _compute(self, result: str, owner: Lock, compute: Callable[[], Awaitable[V]]) -> V:
        """Compute under the lock (renewed while it runs), store the result, give the lock back.
        Work that fails, or is stopped, gives the lock back at once: a waiting replica takes over."""
        self._stats.computed += 1
        renewing = asyncio.create_task(self._renew(owner))
        try:
            value = await compute()
        except BaseException:
            self._give_back(owner, result)
            raise
        finally:
            renewing.cancel()
        try:
            data = self._encode(value)
            if self._keep(value) and len(data) <= self.limits.max_bytes:
                await self._call(self._redis.set(result, data, nx=True, px=int(self.limits.ttl_s * 1000)))
        except RedisError as exc:  # served all the same: this replica's own window keeps it
            self._down(exc)
        self._give_back(owner, result)
        return value

    async def _renew(self, owner: Lock) -> None:
        """Keep the lock while the work runs: a replica that dies stops renewing it, and another
        takes it over within lease_s."""
        while True:
            await asyncio.sleep(self.limits.lease_s / 3)
            try:
                await self._call(owner.reacquire())
            except LockError:  # lapsed (this replica stalled past the lease): another may compute too
                log.warning("a question's lock lapsed while its work ran here; another replica may compute it too")
                return
            except RedisError as exc:
                self._down(exc)
                return

    def _give_back(self, owner: Lock, result: str) -> None:
        """Release the lock and tell the waiting replicas to look again (the work is stored, or
        theirs to take), without waiting for it (this may run in a cancelled task)."""

        async def release() -> None:
            try:
                await self._call(owner.release())
            except LockError:
                pass  # it had lapsed: nothing to give back
            except RedisError as exc:
                self._down(exc)  # it lapses by itself within lease_s
                return
            with contextlib.suppress(RedisError):  # unheard, the waiters find out at their next poll
                await self._call(self._redis.publish(self._channel, result))

        task: asyncio.Task[object] = asyncio.ensure_future(release())
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def _news_of(self, result: str, within_s: float) -> None:
        """Wait until the work named result is stored or given up (word from the listener), for
        at most within_s."""
        event = self._news.setdefault(result, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), within_s)
        except TimeoutError:
            pass
        finally:
            self._news.pop(result, None)

    async def _listen(self) -> None:
        """Wake this replica's waiters when the work they wait for is stored or given up."""
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(self._channel)
                    while True:
                        # A bounded wait: an idle subscription must not hit the socket's timeout.
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=_TIMEOUT_S / 2)
                        event = self._news.get(message["data"].decode()) if message else None
                        if event is not None:
                            event.set()
            except RedisError:
                await asyncio.sleep(self.limits.retry_s)  # the waiters poll meanwhile

    @property
    def _channel(self) -> str:
        return f"{self.limits.namespace}:done"

    async def _alone(self, compute: Callable[[], Awaitable[V]]) -> tuple[V, Shared]:
        self._stats.local += 1
        return await compute(), Shared.COMPUTED

    async def _call(self, call: Awaitable[T]) -> T:
        self._stats.calls += 1
        value = await call
        if self._why:
            log.warning("shared store: Redis answers again")
            self._why = ""
        return value

    def _count(self, how: Shared) -> None:
        if how is Shared.JOINED:
            self._stats.waits += 1
        else:
            self._stats.hits += 1

    def _down(self, exc: Exception) -> None:
        self._stats.errors += 1
        if not self.degraded:
            log.warning("shared store: Redis failed (%r); judging alone for %g s", exc, self.limits.retry_s)
        self._why = f"{type(exc).__name__}: {exc}"[:200]
        self._down_until = time.monotonic() + self.limits.retry_s

    def _names(self, key: bytes) -> tuple[str, str]:
        hexed = key.hex()
        return f"{self.limits.namespace}:q:{hexed}", f"{self.limits.namespace}:lock:{hexed}"
