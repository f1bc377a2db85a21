"""Engine steps: layouts, batching, chunks, the prefix cache and the pool change the cost, never the
greedy output (fp32). Tests drive step() on the model thread."""

import asyncio
import gc
import threading
from concurrent.futures import CancelledError

import pytest

from egrm.engines.base import BranchParams, EngineBusyError, RequestTooLargeError
from egrm.engines.embedded.attention import PaddedRows
from egrm.engines.embedded.engine import EmbeddedEngine
from egrm.engines.embedded.sequence import Job

pytestmark = pytest.mark.slow

GREEDY = BranchParams(temperature=0, max_new_tokens=12)
QUESTIONS = ["Why is the sea salty?", "Name a prime number above 50.", "What does a judge do in court? Be brief."]
LONG = "Tell me about the history of the town. " * 100  # ~900 tokens


def prompts(engine: EmbeddedEngine) -> list[list[int]]:
    return [engine.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


def tokens(branches) -> list[list[int]]:
    return [b.token_ids for b in branches]


def drive(engine: EmbeddedEngine, jobs: list[Job], between=None, later: tuple[Job, ...] = ()) -> int:
    """On the model thread: add the jobs, step until they and `later` (jobs between() adds) are all
    answered; returns the steps taken. between(step) runs after each step (to add jobs, or look)."""

    def run() -> int:
        for job in jobs:
            job.future.set_running_or_notify_cancel()
            engine.add(job)
        steps = 0
        while not all(j.future.done() for j in (*jobs, *later)):
            if not engine.step():  # nothing ran: only right when what was left was dropped
                assert all(j.future.done() for j in (*jobs, *later)), "a step with work to do ran nothing"
                break
            steps += 1
            if between is not None:
                between(steps)
        return steps

    return engine.run_on_model_thread(run)


def hold_model_thread(engine: EmbeddedEngine) -> threading.Event:
    """Occupy the model thread until the returned event is set."""
    started, release = threading.Event(), threading.Event()
    engine.call(lambda: (started.set(), release.wait()))
    started.wait(timeout=10)
    return release


@pytest.fixture(scope="module")
def plain(loaded_fp32):
    engine = EmbeddedEngine(loaded_fp32, layout="batch", prefix_cache=False)
    yield engine
    asyncio.run(engine.close())


def test_layouts_give_the_same_tokens_and_the_branches_share_the_prompts_blocks(loaded_fp32, plain):
    seq = EmbeddedEngine(loaded_fp32, layout="sequence", prefix_cache=False)
    try:
        ids = prompts(plain)[0]
        batched = asyncio.run(plain.sample(ids, [GREEDY] * 5))
        packed = asyncio.run(seq.sample(ids, [GREEDY] * 5))
        used = seq.stats().kv_bytes
    finally:
        asyncio.run(seq.close())
    assert tokens(packed) == tokens(batched)
    # The prompt's full blocks once; each branch its own copy of the partial last one, and the
    # blocks of what it generated (its last token is sampled, not computed).
    block = 16
    full = len(ids) // block
    own = sum(-(-(len(ids) + b.completion_tokens - 1) // block) - full for b in packed)
    cfg = loaded_fp32.model.config
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert used == (full + own) * block * per_token


def test_requests_stepped_together_equal_requests_run_alone(plain):
    ids = prompts(plain)
    before = plain.stats().batches  # the module's engine has stepped for other tests already
    alone = [asyncio.run(plain.sample(p, [GREEDY] * 2)) for p in ids]
    steps_alone = plain.stats().batches - before
    jobs = [Job.sample(p, [GREEDY] * 2) for p in ids]
    steps = drive(plain, jobs)  # three prompts of different lengths in the same steps
    together = [j.future.result() for j in jobs]
    assert [tokens(r) for r in together] == [tokens(r) for r in alone]
    assert steps <= 13 < steps_alone  # a prefill step and 12 decodes, for all three at once
    # Continuations of two of them, and of branches of different requests, in one job.
    more = BranchParams(temperature=0, max_new_tokens=6)
    so = plain.encode(" So")
    both = Job.continuation([together[0][0].handle, together[1][1].handle], so, [more, more], None)
    drive(plain, [both])
    separate = [
        asyncio.run(plain.continue_branches([r[i].handle], " So", [more]))[0].token_ids
        for r, i in ((alone[0], 0), (alone[1], 1))
    ]
    assert tokens(both.future.result()) == separate


def test_a_continuation_joins_the_steps_of_one_already_running(plain):
    ids = prompts(plain)
    a, b = (asyncio.run(plain.sample(p, [GREEDY]))[0] for p in ids[:2])
    more = BranchParams(temperature=0, max_new_tokens=8, ignore_eos=True)
    cont_a = Job.continuation([a.handle], plain.encode(" Next"), [more], None)
    cont_b = Job.continuation([b.handle], plain.encode(" Next"), [more], None)
    forwards = plain.stats().batches

    def add_b(step: int) -> None:
        if step == 1:  # a is already a step ahead when b arrives
            cont_b.future.set_running_or_notify_cancel()
            plain.add(cont_b)

    steps = drive(plain, [cont_a], between=add_b, later=(cont_b,))
    assert plain.stats().batches - forwards == steps <= 10  # one forward per step, for both
    alone = [
        asyncio.run(plain.continue_branches([x.handle], " Next", [more]))[0].token_ids
        for x in (asyncio.run(plain.sample(p, [GREEDY]))[0] for p in ids[:2])
    ]
    assert [cont_a.future.result()[0].token_ids, cont_b.future.result()[0].token_ids] == alone


def test_a_long_prompt_is_computed_in_chunks_beside_the_decodes_of_others(loaded_fp32, plain):
    engine = EmbeddedEngine(loaded_fp32, layout="sequence", prefix_cache=False, max_batch_tokens=64)
    try:
        short, long = prompts(engine)[0], engine.encode_chat([{"role": "user", "content": LONG}])
        assert len(long) > 12 * 64
        first = Job.sample(short, [GREEDY] * 3)
        big = Job.sample(long, [GREEDY] * 2)
        done_at: dict[str, int] = {}

        def look(step: int) -> None:
            for name, job in (("short", first), ("long", big)):
                if job.future.done():
                    done_at.setdefault(name, step)

        drive(engine, [first, big], between=look)
    finally:
        asyncio.run(engine.close())
    assert done_at["short"] < done_at["long"]  # it decoded while the long prompt went in, chunk by chunk
    assert tokens(first.future.result()) == tokens(asyncio.run(plain.sample(short, [GREEDY] * 3)))
    assert tokens(big.future.result()) == tokens(asyncio.run(plain.sample(long, [GREEDY] * 2)))


def test_a_short_decode_is_not_padded_to_the_keys_of_a_long_one_beside_it(plain):
    """Decode rows go to attention together, padded to a common shape: grouped by their key blocks
    too, a short question's row reads its own few blocks, not a ~180-token prompt's."""
    short = plain.encode_chat([{"role": "user", "content": QUESTIONS[0]}])
    long = plain.encode("Tell me about the history of the town. " * 20)
    alone = [tokens(asyncio.run(plain.sample(p, [GREEDY]))) for p in (short, long)]
    runner = plain.core.runner
    inputs = runner.inputs
    widths: list[list[int]] = []  # per step: the key width of each padded attention call

    def recording(chunks):
        step = inputs(chunks)
        widths.append(sorted(a.bias.shape[-1] for a in step.attention if isinstance(a, PaddedRows)))
        return step

    runner.inputs = recording
    try:
        jobs = [Job.sample(p, [GREEDY]) for p in (short, long)]
        drive(plain, jobs)
    finally:
        del runner.inputs
    assert [tokens(j.future.result()) for j in jobs] == alone
    block = 16
    own = -(-(len(short) + GREEDY.max_new_tokens) // block) * block  # the short row's keys, at most
    assert any(len(w) == 2 and w[0] <= own < len(long) <= w[1] for w in widths), widths


def test_the_prefix_cache_serves_shared_heads_with_the_same_output(loaded_fp32, plain):
    cached = EmbeddedEngine(loaded_fp32, layout="sequence")
    try:
        ids = prompts(cached)
        first = [asyncio.run(cached.sample(p, [GREEDY])) for p in ids]
        again = [asyncio.run(cached.sample(p, [GREEDY])) for p in ids]
        hits = cached.stats().prefix_cache_hit_tokens
    finally:
        asyncio.run(cached.close())
    reference = [asyncio.run(plain.sample(p, [GREEDY]))[0].token_ids for p in ids]
    assert [r[0].token_ids for r in first] == reference == [r[0].token_ids for r in again]
    # Whole blocks of each prompt, its last token excepted, came from the cache the second time.
    assert [r[0].cached_prompt_tokens for r in again] == [(len(p) - 1) // 16 * 16 for p in ids]
    assert hits >= sum(r[0].cached_prompt_tokens for r in again) > 0


def test_a_small_pool_preempts_and_recomputes_with_the_same_output(loaded_fp32, plain):
    """Five requests of five branches in a pool that holds about two: they wait for blocks, running
    branches are preempted and recomputed, held branches lose their KV, and nothing changes."""
    engine = EmbeddedEngine(loaded_fp32, prefix_cache=True, kv_cache_mb=24)  # 34 blocks of 16 tokens
    try:
        ids = prompts(engine)
        params = [BranchParams(temperature=0, max_new_tokens=40, ignore_eos=True)] * 5
        jobs = [Job.sample(ids[i % 3], params) for i in range(5)]
        peak: list[int] = []
        drive(engine, jobs, between=lambda _: peak.append(engine.stats().kv_bytes))
        assert max(peak) <= engine.stats().kv_capacity_bytes
        assert engine.core.scheduler.preempted > 0
        # A held branch whose KV was dropped is recomputed when continued.
        held = jobs[0].future.result()[0]
        more = BranchParams(temperature=0, max_new_tokens=5)
        continued = asyncio.run(engine.continue_branches([held.handle], " So", [more]))[0]
    finally:
        asyncio.run(engine.close())
    expected = tokens(asyncio.run(plain.sample(ids[0], params)))
    assert [tokens(j.future.result()) for j in jobs[::3]] == [
        expected,
        tokens(asyncio.run(plain.sample(ids[0], params))),
    ]
    again = asyncio.run(plain.sample(ids[0], params))[0]
    assert continued.token_ids == asyncio.run(plain.continue_branches([again.handle], " So", [more]))[0].token_ids


def test_a_call_that_could_never_fit_is_refused_up_front(loaded_fp32):
    engine = EmbeddedEngine(loaded_fp32, kv_cache_mb=4, max_batch_branches=4)  # 5 blocks: 80 tokens
    try:
        with pytest.raises(RequestTooLargeError, match="EGRM_KV_CACHE_MB"):
            asyncio.run(engine.sample(prompts(engine)[2], [BranchParams(max_new_tokens=64)]))
        with pytest.raises(RequestTooLargeError, match="EGRM_MAX_BATCH_BRANCHES"):
            asyncio.run(engine.sample([1, 2, 3], [BranchParams(max_new_tokens=1)] * 5))
        assert engine.stats().batches == 0
    finally:
        asyncio.run(engine.close())


def test_an_abandoned_job_stops_and_frees_its_blocks_at_the_next_step(loaded_fp32):
    engine = EmbeddedEngine(loaded_fp32, prefix_cache=False, max_batch_tokens=64)
    try:
        long = engine.encode_chat([{"role": "user", "content": LONG}])
        job = Job.sample(long, [GREEDY] * 4)

        def abandon(step: int) -> None:
            if step == 2:
                assert engine.stats().kv_bytes > 0
                engine.core.abort(job)  # the caller's deadline passed: the front aborts, and answers it
                job.future.set_exception(CancelledError("the caller stopped waiting"))

        drive(engine, [job], between=abandon)
        assert job.future.cancelled() or job.future.exception() is not None
        assert engine.stats().kv_bytes == 0 and engine.stats().batches == 2  # no forward after it
    finally:
        asyncio.run(engine.close())


def test_a_full_queue_refuses_at_once(loaded_fp32):
    engine = EmbeddedEngine(loaded_fp32, max_queue=1)
    try:
        busy = hold_model_thread(engine)
        waiting = engine.call(lambda: None)  # fills the queue (1 slot)
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

        async def leave_early() -> None:
            call = asyncio.ensure_future(engine.sample(prompts(engine)[0], [GREEDY]))
            await asyncio.sleep(0.05)
            call.cancel()  # the caller went away while its job waited

        asyncio.run(leave_early())
        hold.set()
        engine.run_on_model_thread(lambda: None)  # everything before it has been handled
        assert engine.stats().batches == 0
    finally:
        asyncio.run(engine.close())


def test_the_kv_held_by_live_branches_is_reported_and_freed_with_them(loaded_fp32):
    """egrm_engine_kv_bytes: a branch's KV counts while it is held (the long path may continue it),
    and not once the last handle is dropped."""
    engine = EmbeddedEngine(loaded_fp32, prefix_cache=False)
    try:
        assert engine.stats().kv_bytes == 0
        assert engine.stats().kv_capacity_bytes >= 1024 * 2**20 - 2**20
        branches = asyncio.run(engine.sample(prompts(engine)[0], [GREEDY] * 3))
        assert engine.stats().kv_bytes > 0
        del branches
        gc.collect()
        engine.run_on_model_thread(lambda: None)  # the release went through the inbox before this
        assert engine.stats().kv_bytes == 0
        assert engine.stats().gc_released == 3  # freed by the safety net, and counted
    finally:
        asyncio.run(engine.close())


def test_released_branches_free_their_kv_and_a_released_handle_can_still_be_continued(loaded_fp32):
    engine = EmbeddedEngine(loaded_fp32, prefix_cache=False)
    try:
        branches = asyncio.run(engine.sample(prompts(engine)[0], [GREEDY] * 3))
        more = BranchParams(temperature=0, max_new_tokens=4)
        kept = asyncio.run(engine.continue_branches([branches[0].handle], " So", [more]))
        engine.release([b.handle for b in branches + kept])
        engine.run_on_model_thread(lambda: None)
        assert engine.stats().kv_bytes == 0 and engine.stats().gc_released == 0
        # Its tokens are still known: continuing it recomputes its KV, to the same tokens.
        again = asyncio.run(engine.continue_branches([branches[0].handle], " So", [more]))
        assert again[0].token_ids == kept[0].token_ids and again[0].cached_prompt_tokens == 0
        engine.release([again[0].handle])
        del branches, kept, again
        gc.collect()
        engine.run_on_model_thread(lambda: None)
        assert engine.stats().gc_released == 0  # all released by hand: the collector had nothing to do
    finally:
        asyncio.run(engine.close())
