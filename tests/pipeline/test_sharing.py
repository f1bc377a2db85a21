"""The shared-work store on its own: single flight, grace, a bounded window, admission."""

from __future__ import annotations

import asyncio

import pytest

from egrm.aio import DEADLINE
from egrm.pipeline.sharing import OverloadedError, SharedWork, SharingLimits
from egrm.pipeline.types import Shared


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Work:
    """compute() for a key: counts its runs, finishes when released (or fails, if told to)."""

    def __init__(self) -> None:
        self.runs = 0
        self.cancelled = 0
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self) -> str:
        self.runs += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail is not None:
            raise self.fail
        return f"work #{self.runs}"


def store(clock: Clock | None = None, **limits) -> SharedWork[str]:
    return SharedWork(SharingLimits(**limits), size_of=len, keep=lambda v: "degraded" not in v, clock=clock or Clock())


def run(coro):
    return asyncio.run(coro)


def test_concurrent_requests_for_one_key_share_one_computation():
    async def go():
        shared, work = store(), Work()
        tasks = [asyncio.ensure_future(shared.get("q", work)) for _ in range(8)]
        await asyncio.sleep(0)
        work.release.set()
        results = await asyncio.gather(*tasks)
        later = await shared.get("q", work)
        return work.runs, results, later, shared.stats()

    runs, results, later, stats = run(go())
    assert runs == 1
    assert [r for r, _ in results] == ["work #1"] * 8
    assert [how for _, how in results] == [Shared.COMPUTED] + [Shared.JOINED] * 7
    assert later == ("work #1", Shared.CACHED)
    assert (stats.misses, stats.joins, stats.hits, stats.entries, stats.bytes) == (1, 7, 1, 1, len("work #1"))


def test_one_waiter_leaving_never_cancels_the_work_for_the_others():
    async def go():
        shared, work = store(), Work()
        leaving = asyncio.ensure_future(shared.get("q", work))
        staying = asyncio.ensure_future(shared.get("q", work))
        await asyncio.sleep(0)
        leaving.cancel()  # its deadline passed, or its client went away
        await asyncio.sleep(0)
        work.release.set()
        return await staying, work.cancelled

    (value, _), cancelled = run(go())
    assert value == "work #1" and cancelled == 0


def test_work_nobody_waits_for_goes_on_for_the_grace_so_a_retry_finds_it():
    async def go():
        shared, work = store(grace_s=0.2), Work()
        first = asyncio.ensure_future(shared.get("q", work))
        await asyncio.sleep(0)
        first.cancel(DEADLINE)  # the first try's deadline
        await asyncio.sleep(0.05)  # the trainer's retry comes back within the grace
        retry = asyncio.ensure_future(shared.get("q", work))
        await asyncio.sleep(0.3)  # past the grace: the retry waits, so the work was not stopped
        work.release.set()
        return await retry, work.runs, work.cancelled

    (value, how), runs, cancelled = run(go())
    assert (value, how, runs, cancelled) == ("work #1", Shared.JOINED, 1, 0)


def test_work_nobody_comes_back_for_is_stopped_after_the_grace():
    async def go():
        shared, work = store(grace_s=0.05), Work()
        first = asyncio.ensure_future(shared.get("q", work))
        await asyncio.sleep(0)
        first.cancel(DEADLINE)
        await asyncio.sleep(0.15)
        stopped = work.cancelled
        work.release.set()
        again = await shared.get("q", work)  # nothing was kept: it starts anew
        return stopped, again, shared.stats()

    stopped, again, stats = run(go())
    assert stopped == 1 and again == ("work #2", Shared.COMPUTED) and stats.running == 0


def test_work_whose_last_waiter_went_away_is_stopped_at_once_unless_a_grace_runs():
    async def go():
        shared, work = store(grace_s=60), Work()
        gone = asyncio.ensure_future(shared.get("q", work))
        await asyncio.sleep(0)
        gone.cancel()  # its client disconnected: nobody will come back for this
        await asyncio.sleep(0.01)
        stopped = work.cancelled
        late = asyncio.ensure_future(shared.get("r", work))
        await asyncio.sleep(0)
        late.cancel(DEADLINE)  # a deadline: the grace starts ...
        await asyncio.sleep(0)
        retry = asyncio.ensure_future(shared.get("r", work))
        await asyncio.sleep(0)
        retry.cancel()  # ... and a retry that then disconnects does not end it
        await asyncio.sleep(0.01)
        return stopped, work.cancelled, shared.stats().running

    stopped, cancelled, running = run(go())
    assert (stopped, cancelled, running) == (1, 1, 1)


def test_degraded_work_serves_its_waiters_and_is_not_kept():
    async def go():
        shared = store()

        async def degraded() -> str:
            return "degraded: the scorer failed"

        first = await shared.get("q", degraded)
        return first, await shared.get("q", degraded), shared.stats()

    first, second, stats = run(go())
    assert first[1] is Shared.COMPUTED and second[1] is Shared.COMPUTED and stats.entries == 0


def test_a_failure_fails_its_waiters_only_and_is_not_kept():
    async def go():
        shared, work = store(), Work()
        work.fail = RuntimeError("backend down")
        tasks = [asyncio.ensure_future(shared.get("q", work)) for _ in range(3)]
        await asyncio.sleep(0)
        work.release.set()
        failures = await asyncio.gather(*tasks, return_exceptions=True)
        work.fail = None
        return failures, await shared.get("q", work)

    failures, after = run(go())
    assert all(isinstance(f, RuntimeError) and str(f) == "backend down" for f in failures)
    assert after == ("work #2", Shared.COMPUTED)


def test_the_window_is_bounded_in_entries_bytes_and_age():
    async def done(shared: SharedWork[str], key: str, value: str) -> None:
        async def compute() -> str:
            return value

        await shared.get(key, compute)

    async def go():
        clock = Clock()
        by_count = store(clock, max_entries=2)
        for key in "abc":
            await done(by_count, key, key * 4)
        by_bytes = store(clock, max_bytes=10)
        for key in "abc":
            await done(by_bytes, key, key * 4)
        await done(by_bytes, "big", "x" * 11)  # larger than the whole window: never kept
        aged = store(clock, ttl_s=60)
        await done(aged, "a", "aaaa")
        clock.now = 59
        kept = aged.stats().entries
        clock.now = 61
        return by_count.stats(), by_bytes.stats(), kept, aged.stats().entries

    count, size, kept, expired = run(go())
    assert (count.entries, count.bytes) == (2, 8)  # the least recently used went first
    assert (size.entries, size.bytes) == (2, 8)
    assert (kept, expired) == (1, 0)


def test_new_work_that_could_not_finish_before_the_deadline_is_refused():
    async def go():
        clock = Clock()
        shared = store(clock, grace_s=10)
        for i in range(5):  # five works, 10 s of running each: 0.1 works a second

            async def slow() -> str:
                clock.now += 10
                return "done"

            await shared.get(f"done{i}", slow)
        running, work = Work(), Work()
        tasks = [asyncio.ensure_future(shared.get(f"busy{i}", running)) for i in range(3)]
        await asyncio.sleep(0)
        joined = asyncio.ensure_future(shared.get("busy0", running, deadline_s=1))  # joining is never refused
        with pytest.raises(OverloadedError) as refused:
            await shared.get("new", work, deadline_s=5)  # 4 works ahead: 40 s > 5 + 10
        unbounded = asyncio.ensure_future(shared.get("new", work))  # no deadline known: taken
        admitted = asyncio.ensure_future(shared.get("new2", Work(), deadline_s=60))  # 50 s <= 60 + 10
        await asyncio.sleep(0.01)
        for t in (*tasks, joined, unbounded, admitted):
            t.cancel()
        return refused.value, shared.stats(), work.runs

    refused, stats, runs = run(go())
    assert refused.retry_after_s == 25 and "deadline" in str(refused) and stats.refused == 1
    assert runs == 1 and stats.misses == 5 + 3 + 2


def test_work_nobody_waits_for_is_background_and_does_not_count_at_admission():
    """A deadline passed: its work runs on for the grace (orphaned, not waited), newcomers are
    admitted as if it did not run, and the grace's end drops it."""

    async def go():
        clock = Clock()
        shared = store(clock, grace_s=0.05)
        for i in range(5):  # 0.1 works a second

            async def slow() -> str:
                clock.now += 10
                return "done"

            await shared.get(f"done{i}", slow)
        hostile, polite = Work(), Work()
        tries = [asyncio.ensure_future(shared.get(f"hostile{i}", hostile)) for i in range(3)]
        await asyncio.sleep(0)
        assert [shared.waited(f"hostile{i}") for i in range(3)] == [True] * 3
        for t in tries:
            t.cancel(DEADLINE)
        await asyncio.sleep(0)
        orphaned = shared.stats().orphaned, [shared.waited(f"hostile{i}") for i in range(3)]
        # Three orphaned works would be 40 s ahead of it at 0.1/s: not counted, it is admitted.
        admitted = asyncio.ensure_future(shared.get("polite", polite, deadline_s=5))
        await asyncio.sleep(0.1)  # past the grace
        stats = shared.stats()
        polite.release.set()
        return orphaned, await admitted, stats

    (orphaned, waited), (value, how), stats = run(go())
    assert orphaned == 3 and waited == [False] * 3
    assert (value, how) == ("work #1", Shared.COMPUTED) and stats.refused == 0
    assert stats.dropped == 3 and stats.orphaned == 0


def test_admission_counts_a_requests_own_work_at_its_share_so_one_cannot_have_others_refused():
    async def go():
        clock = Clock()
        shared = store(clock, grace_s=10)
        for i in range(5):  # 0.1 works a second

            async def slow() -> str:
                clock.now += 10
                return "done"

            await shared.get(f"done{i}", slow)
        big, small = object(), object()
        running = [asyncio.ensure_future(shared.get(f"big{i}", Work(), 60, owner=big)) for i in range(3)]
        await asyncio.sleep(0)
        # The small request's one question, at half the engine: 20 s, within 60 + 10.
        taken = asyncio.ensure_future(shared.get("small", Work(), 60, owner=small))
        await asyncio.sleep(0)
        with pytest.raises(OverloadedError):  # the big one's 4th at half the engine: 80 s > 70
            await shared.get("big3", Work(), 60, owner=big)
        small_running = not taken.done()  # admitted, and waiting for its work
        for t in (*running, taken):
            t.cancel()
        await asyncio.gather(*running, taken, return_exceptions=True)
        return small_running, shared.stats()

    small_was_running, stats = run(go())
    assert small_was_running and stats.refused == 1 and stats.misses == 5 + 3 + 1
