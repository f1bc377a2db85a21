"""Layouts, request batching and the prefix cache change the cost, never the greedy output (fp32)."""

import asyncio
import threading

import pytest

from app.engines.base import BranchParams, EngineBusyError
from app.engines.embedded.engine import EmbeddedEngine
from app.engines.embedded.scheduler import ContinueJob, SampleJob, Scheduler

pytestmark = pytest.mark.slow

GREEDY = BranchParams(temperature=0, max_new_tokens=12)
QUESTIONS = ["Why is the sea salty?", "Name a prime number above 50.", "What does a judge do in court? Be brief."]


def prompts(engine: EmbeddedEngine) -> list[list[int]]:
    return [engine.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


def hold_model_thread(engine: EmbeddedEngine) -> threading.Event:
    """Occupy the model thread until the returned event is set."""
    started, release = threading.Event(), threading.Event()
    engine._scheduler.call(lambda: (started.set(), release.wait()))
    started.wait(timeout=10)
    return release


def run_rounds(engine: EmbeddedEngine, jobs) -> None:
    """What the model thread does with jobs admitted together, here, to the end."""
    rounds = engine._start(jobs)
    while rounds:
        rounds = engine._advance(rounds)


@pytest.fixture(scope="module")
def plain(loaded_fp32):
    engine = EmbeddedEngine(loaded_fp32, layout="batch", prefix_cache=False)
    yield engine
    asyncio.run(engine.close())


def test_one_sequence_equals_batch_and_stores_the_prefix_once(loaded_fp32, plain):
    seq = EmbeddedEngine(loaded_fp32, layout="sequence", prefix_cache=False)
    try:
        ids = prompts(plain)[0]
        batched = asyncio.run(plain.sample(ids, [GREEDY] * 5))
        packed = asyncio.run(seq.sample(ids, [GREEDY] * 5))
    finally:
        asyncio.run(seq.close())
    assert [b.token_ids for b in packed] == [b.token_ids for b in batched]
    new = sum(b.completion_tokens for b in batched)
    cfg = loaded_fp32.model.config
    per_slot = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    # Batch rows each hold a copy of the prefix; one sequence holds it once. The last token of
    # each branch is sampled but not yet fed, so it has no slot in either layout.
    assert batched[0].handle.fork.kv_bytes == per_slot * (5 * len(ids) + new - 5)
    assert packed[0].handle.fork.kv_bytes == per_slot * (len(ids) + new - 5)


def test_requests_batched_together_equal_requests_run_alone(plain):
    ids = prompts(plain)
    alone = [asyncio.run(plain.sample(p, [GREEDY] * 2)) for p in ids]
    jobs = [SampleJob(p, [GREEDY] * 2) for p in ids]
    run_rounds(plain, jobs)  # on this thread: three prefixes of different lengths, one fork
    together = [j.future.result() for j in jobs]
    assert [[b.token_ids for b in r] for r in together] == [[b.token_ids for b in r] for r in alone]
    assert len({id(r[0].handle.fork) for r in together}) == 1  # they really shared one fork
    # Continuations of two requests of that fork merge into one round too.
    more = BranchParams(temperature=0, max_new_tokens=6)
    so = plain.encode(" So")
    conts = [ContinueJob(r[0].handle.fork, [b.handle.row for b in r], so, [more, more]) for r in together[:2]]
    run_rounds(plain, conts)
    merged = [[b.token_ids for b in c.future.result()] for c in conts]
    separate = [
        [b.token_ids for b in asyncio.run(plain.continue_branches([x.handle for x in r], " So", [more, more]))]
        for r in alone[:2]
    ]
    assert merged == separate


def test_concurrent_calls_through_the_async_api(plain):
    ids = prompts(plain)

    async def all_at_once():
        return await asyncio.gather(*(plain.sample(p, [GREEDY]) for p in ids * 2))

    results = asyncio.run(all_at_once())
    alone = [asyncio.run(plain.sample(p, [GREEDY]))[0].token_ids for p in ids]
    assert [r[0].token_ids for r in results] == alone * 2


def test_prefix_cache_serves_the_shared_head_with_the_same_output(loaded_fp32, plain):
    cached = EmbeddedEngine(loaded_fp32, layout="sequence")
    try:
        ids = prompts(cached)
        first = [asyncio.run(cached.sample(p, [GREEDY])) for p in ids]  # learns the shared head
        again = [asyncio.run(cached.sample(p, [GREEDY])) for p in ids]
        assert cached.prefix_cache is not None and cached.prefix_cache.hits > 0
    finally:
        asyncio.run(cached.close())
    reference = [asyncio.run(plain.sample(p, [GREEDY]))[0].token_ids for p in ids]
    assert [r[0].token_ids for r in first] == reference == [r[0].token_ids for r in again]
    # The cache hit is reported as cached prompt tokens on the first branch.
    assert all(r[0].cached_prompt_tokens > 0 for r in again)


def test_a_full_queue_refuses_at_once(loaded_fp32):
    engine = EmbeddedEngine(loaded_fp32, max_queue=1)
    try:
        busy = hold_model_thread(engine)
        waiting = engine._scheduler.call(lambda: None)  # fills the queue (1 slot)
        with pytest.raises(EngineBusyError):
            asyncio.run(engine.sample(prompts(engine)[0], [GREEDY]))
        busy.set()
        waiting.result(timeout=10)
    finally:
        asyncio.run(engine.close())


def test_a_cancelled_caller_costs_no_model_work(loaded_fp32):
    engine = EmbeddedEngine(loaded_fp32)
    try:
        hold = hold_model_thread(engine)
        job = SampleJob(prompts(engine)[0], [GREEDY])
        engine._scheduler.submit(job)
        job.future.cancel()  # the caller went away while it waited
        hold.set()
        engine.run_on_model_thread(lambda: None)  # everything before it has been handled
        assert job.future.cancelled() and engine.stats().batches == 0
    finally:
        asyncio.run(engine.close())


def test_rounds_on_one_fork_share_each_forward(plain):
    """A continuation admitted while another is decoding on the same fork joins its forwards."""
    ids = prompts(plain)
    jobs = [SampleJob(p, [GREEDY]) for p in ids[:2]]
    run_rounds(plain, jobs)
    a, b = (j.future.result()[0] for j in jobs)
    more = BranchParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    cont_a = ContinueJob(a.handle.fork, [a.handle.row], plain.encode(" Next"), [more])
    cont_b = ContinueJob(b.handle.fork, [b.handle.row], plain.encode(" Next"), [more])
    rounds = plain._advance(plain._start([cont_a]))  # a is already a step ahead when b arrives
    rounds += plain._start([cont_b])
    steps_before, advances = plain.stats().decode_steps, 0
    while rounds:
        rounds = plain._advance(rounds)
        advances += 1
    assert plain.stats().decode_steps - steps_before == advances  # one forward per step for both
    alone = [
        asyncio.run(plain.continue_branches([x.handle], " Next", [more]))[0].token_ids
        for x in (asyncio.run(plain.sample(p, [GREEDY]))[0] for p in ids[:2])
    ]
    assert [cont_a.future.result()[0].token_ids, cont_b.future.result()[0].token_ids] == alone


def test_big_prompts_are_admitted_within_the_token_budget(loaded_fp32, plain):
    """Jobs waiting together are admitted together only while their prompts fit max_batch_tokens:
    one admission is one uninterruptible prefill. A single bigger prompt still goes, alone."""
    ids = prompts(plain)
    budget = len(ids[0]) + len(ids[1])  # the first two fit together; the third waits
    engine = EmbeddedEngine(loaded_fp32, prefix_cache=False, max_batch_tokens=budget)
    try:
        hold = hold_model_thread(engine)
        jobs = [SampleJob(p, [GREEDY]) for p in ids]
        for job in jobs:
            engine._scheduler.submit(job)
        hold.set()
        done = [job.future.result(timeout=60) for job in jobs]
        assert engine.stats().batches == 2 and engine.stats().batched_requests == 3
        alone = EmbeddedEngine(loaded_fp32, prefix_cache=False, max_batch_tokens=16)  # below any prompt
        try:
            one_by_one = [asyncio.run(alone.sample(p, [GREEDY])) for p in ids]
        finally:
            asyncio.run(alone.close())
    finally:
        asyncio.run(engine.close())
    assert [d[0].token_ids for d in done] == [o[0].token_ids for o in one_by_one]


def test_a_small_job_is_admitted_beside_big_ones_that_wait():
    """Past the token budget a job waits, oldest first, and the next batch opens with it; a younger
    job that fits goes ahead, so a small request does not queue behind every big prompt."""
    admitted: list[list[int]] = []
    scheduler = Scheduler(lambda jobs: admitted.append([j.tokens for j in jobs]) or [], lambda r: [], 64, 128, 0.0, 100)
    try:
        release = threading.Event()
        scheduler.call(release.wait)
        jobs = [SampleJob([1] * n, [GREEDY]) for n in (80, 90, 10, 300, 5)]
        for job in jobs:
            scheduler.submit(job)
        release.set()
        scheduler.call(lambda: None).result(timeout=10)
    finally:
        scheduler.close()
    assert admitted == [[80, 10, 5], [90], [300]]


def test_the_kv_held_by_live_branches_is_reported_and_freed_with_them(loaded_fp32):
    """egrm_engine_kv_bytes: a fork's KV counts while any of its branches is held (the long path may
    continue it), and not once the last one is dropped."""
    import gc

    engine = EmbeddedEngine(loaded_fp32, prefix_cache=False)
    try:
        assert engine.stats().kv_bytes == 0
        branches = asyncio.run(engine.sample(prompts(engine)[0], [GREEDY] * 3))
        held = engine.stats().kv_bytes
        assert held == branches[0].handle.fork.allocated_bytes > 0
        del branches
        gc.collect()
        assert engine.stats().kv_bytes == 0
    finally:
        asyncio.run(engine.close())
