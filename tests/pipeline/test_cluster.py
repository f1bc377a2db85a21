"""The replicas' shared store against a real redis-server: single flight across replicas, the
lock taken over when its holder is gone, and a replica that loses Redis judging on its own.

Each ClusterStore here stands for one replica (its own client and connections to the server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from egrm.pipeline.cluster import ClusterLimits, ClusterStore
from egrm.pipeline.types import Shared
from loadtest.serverproc import free_port, redis_server


@pytest.fixture
def redis_url() -> Iterator[str]:
    with redis_server() as (url, _):
        yield url


def replica(url: str, client: type[Redis] | None = None, **limits) -> ClusterStore[str]:
    """One replica's store, on the client it makes itself, or on `client` (a Redis subclass that
    slows or breaks reads)."""
    redis = client.from_url(url) if client else None
    return ClusterStore(ClusterLimits(url, **limits), encode=str.encode, keep=lambda v: v != "degraded", redis=redis)


def decode(data: bytes, how: Shared) -> str:
    return data.decode()


class Counted:
    """A question's work that counts how often it runs and takes as long as a gate says."""

    def __init__(self, value: str = "work", fail: bool = False):
        self.value, self.fail, self.runs = value, fail, 0
        self.gate = asyncio.Event()

    async def __call__(self) -> str:
        self.runs += 1
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("the scorer fell over")
        return self.value


async def started(work: Counted) -> None:
    while not work.runs:
        await asyncio.sleep(0.005)


def test_a_question_asked_on_two_replicas_at_once_is_computed_once(redis_url):
    async def main():
        a, b = replica(redis_url), replica(redis_url)
        work = Counted()
        first = asyncio.ensure_future(a.get(b"q1", work, decode))
        await started(work)
        second = asyncio.ensure_future(b.get(b"q1", work, decode))
        await asyncio.sleep(0.05)  # b polls while a computes
        work.gate.set()
        assert await first == ("work", Shared.COMPUTED)
        assert await second == ("work", Shared.JOINED)
        assert await b.get(b"q1", work, decode) == ("work", Shared.CACHED)  # finished: read
        assert work.runs == 1
        assert (a.stats().computed, b.stats().waits, b.stats().hits) == (1, 1, 1)
        await a.close()
        await b.close()

    asyncio.run(main())


def test_replicas_count_their_live_peers(redis_url):
    async def main():
        a, b = replica(redis_url), replica(redis_url)
        await a.check()
        assert a.peers == 0  # alone: it never yields a question to anybody
        await b.check()
        await a.check()
        assert (a.peers, b.peers) == (1, 1)
        await b.close()  # leaving says so at once
        await a.check()
        assert a.peers == 0
        await a.close()

    asyncio.run(main())


class SlowFirstReads(Redis):
    """A Redis whose first read of each key takes 0.1 s longer: a burst's reads open new
    connections, on a busy machine."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: set[str] = set()

    async def get(self, name):
        if name not in self.seen:
            self.seen.add(name)
            await asyncio.sleep(0.1)
        return await super().get(name)


@pytest.mark.parametrize("reads", ["quick", "slow"])
def test_a_burst_of_questions_on_two_replicas_spreads_over_both(redis_url, reads):
    """Each replica waits a little per question it already computes before taking a new one:
    the one that asks first does not take them all. The wait runs from the read that found no
    result: a first read slower than all the waits together does not count as waited."""

    async def main():
        client = SlowFirstReads if reads == "slow" else None
        a, b = replica(redis_url, client), replica(redis_url, client)
        for store in (a, b, a):  # each alive, and each knows the other
            await store.check()
        keys = [f"burst{i}".encode() for i in range(8)]
        works = {k: Counted() for k in keys}
        on_a = [asyncio.ensure_future(a.get(k, works[k], decode)) for k in keys]
        await asyncio.sleep(0.002)
        on_b = [asyncio.ensure_future(b.get(k, works[k], decode)) for k in keys]
        while sum(w.runs for w in works.values()) < len(keys):  # every question claimed once
            await asyncio.sleep(0.005)
        for w in works.values():
            w.gate.set()
        results = await asyncio.gather(*on_a, *on_b)
        assert all(value == "work" for value, _ in results)
        assert all(w.runs == 1 for w in works.values())
        assert a.stats().computed >= 1 and b.stats().computed >= 1, (a.stats(), b.stats())
        await a.close()
        await b.close()

    asyncio.run(main())


class FailsAfterTheLock(Redis):
    """A Redis whose second read of a key fails: the one a replica makes after taking the key's
    lock, to see whether another stored the work meanwhile."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads: dict[str, int] = {}

    async def get(self, name):
        self.reads[name] = self.reads.get(name, 0) + 1
        if self.reads[name] == 2:
            raise RedisConnectionError("the connection broke")
        return await super().get(name)


def test_a_read_that_fails_after_the_lock_gives_the_lock_back(redis_url):
    """The replica judges on its own, and the question is not held from the others for the lease."""

    async def main():
        a = replica(redis_url, FailsAfterTheLock, lease_s=60)
        b = replica(redis_url, lease_s=60)
        work, other = Counted(), Counted()
        work.gate.set()
        other.gate.set()
        assert await a.get(b"q7", work, decode) == ("work", Shared.COMPUTED)
        assert a.stats().local == 1  # on its own: Redis failed
        assert await asyncio.wait_for(b.get(b"q7", other, decode), 5) == ("work", Shared.COMPUTED)
        assert b.stats().computed == 1
        await a.close()
        await b.close()

    asyncio.run(main())


def test_a_replica_that_died_holding_a_question_is_taken_over_once_its_lease_lapses(redis_url):
    async def main():
        b = replica(redis_url, lease_s=0.3)
        # A replica took the lock, then died: nobody renews or gives it back.
        dead = Redis.from_url(redis_url)
        assert await dead.set("egrm:lock:" + b"q2".hex(), "a dead replica's token", nx=True, px=300)
        work = Counted()
        work.gate.set()
        assert await asyncio.wait_for(b.get(b"q2", work, decode), 10) == ("work", Shared.COMPUTED)
        assert work.runs == 1 and b.stats().takeovers == 1
        await dead.aclose()
        await b.close()

    asyncio.run(main())


def test_a_holder_that_keeps_working_keeps_its_lock_past_the_lease(redis_url):
    async def main():
        # A lease of 1 s, renewed every third of it: a 0.3 s lease lapsed once in `make test` (a
        # stall of 0.2 s on this 2-core machine), and another replica then computed the question too.
        a, b = replica(redis_url, lease_s=1.0), replica(redis_url, lease_s=1.0)
        work = Counted()
        first = asyncio.ensure_future(a.get(b"q3", work, decode))
        await started(work)
        second = asyncio.ensure_future(b.get(b"q3", work, decode))
        await asyncio.sleep(3.0)  # three leases: a renews its lock, b keeps waiting
        assert work.runs == 1 and not second.done()
        work.gate.set()
        assert (await first)[1] is Shared.COMPUTED and (await second)[1] is Shared.JOINED
        await a.close()
        await b.close()

    asyncio.run(main())


@pytest.mark.parametrize("how", ["fails", "is cancelled"])
def test_work_that_fails_or_is_stopped_gives_its_lock_back_at_once(redis_url, how):
    """A waiting replica takes over without waiting for the lease (a minute here)."""

    async def main():
        a, b = replica(redis_url, lease_s=60), replica(redis_url, lease_s=60)
        broken = Counted(fail=how == "fails")
        first = asyncio.ensure_future(a.get(b"q4", broken, decode))
        await started(broken)
        healthy = Counted()
        healthy.gate.set()
        second = asyncio.ensure_future(b.get(b"q4", healthy, decode))
        await asyncio.sleep(0.05)
        if how == "fails":
            broken.gate.set()
            with pytest.raises(RuntimeError):
                await first
        else:
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first
        assert await asyncio.wait_for(second, 10) == ("work", Shared.COMPUTED)
        assert b.stats().takeovers == 1
        await a.close()
        await b.close()

    asyncio.run(main())


def test_degraded_work_and_work_over_the_byte_bound_are_served_not_stored(redis_url):
    async def main():
        a = replica(redis_url, max_bytes=8)
        for key, value in ((b"q5", "degraded"), (b"q6", "more than eight bytes")):
            work = Counted(value)
            work.gate.set()
            assert await a.get(key, work, decode) == (value, Shared.COMPUTED)
            assert await a.get(key, work, decode) == (value, Shared.COMPUTED)  # not stored: computed again
            assert work.runs == 2
        await a.close()

    asyncio.run(main())


def test_a_replica_that_loses_redis_judges_alone_then_comes_back():
    port = free_port()

    async def ask(a: ClusterStore[str], key: bytes) -> tuple[str, Shared]:
        work = Counted()
        work.gate.set()
        return await a.get(key, work, decode)

    async def main():
        with redis_server(port) as (url, _):
            a = replica(url, retry_s=0.3)
            assert await ask(a, b"q7") == ("work", Shared.COMPUTED)
        # Redis is gone: the question is judged here, nothing is lost, and the replica says so.
        assert await ask(a, b"q8") == ("work", Shared.COMPUTED)
        assert a.degraded and a.describe().startswith("redis: degraded (ConnectionError")
        calls = a.stats().calls
        assert await ask(a, b"q9") == ("work", Shared.COMPUTED)
        assert a.stats().calls == calls  # within retry_s, Redis is not asked again
        assert (a.stats().local, a.stats().errors) == (2, 1)
        with redis_server(port):
            await asyncio.sleep(0.3)
            assert await ask(a, b"q10") == ("work", Shared.COMPUTED)
            assert not a.degraded and a.describe() == "redis"
            assert await ask(a, b"q10") == ("work", Shared.CACHED)
            await a.close()

    asyncio.run(main())


def test_redis_lost_while_a_question_is_computed_loses_nothing():
    async def main():
        with redis_server() as (url, proc):
            a = replica(url)
            work = Counted()
            running = asyncio.ensure_future(a.get(b"q11", work, decode))
            await started(work)
            proc.kill()
            proc.wait()
            work.gate.set()
            assert await running == ("work", Shared.COMPUTED)  # served; storing it failed
            assert a.degraded and a.stats().errors >= 1
            await a.close()

    asyncio.run(main())
