"""What a step computes: decodes first, prompt chunks shared among client requests, blocks bounding it all."""

from app.engines.base import BranchParams
from app.engines.embedded.kv_cache import BlockManager
from app.engines.embedded.scheduler import Scheduler
from app.engines.embedded.sequence import Job

ONE = [BranchParams(temperature=0)]


def job(tokens: int, tag: object, branches: int = 1) -> Job:
    return Job.sample(list(range(1, tokens + 1)), ONE * branches, tag)


def run(scheduler: Scheduler, chunks) -> None:
    """What the engine does after the forward, minus sampling: the chunks' tokens are computed."""
    for c in chunks:
        c.seq.computed += c.tokens


def test_a_small_request_is_prefilled_beside_a_big_one_that_came_first():
    scheduler = Scheduler(BlockManager(4096), max_seqs=128, max_tokens=256)
    for _ in range(20):
        scheduler.add(job(1000, "big"))
    small = job(40, "small")
    scheduler.add(small)
    chunks = scheduler.schedule()
    assert 40 < sum(c.tokens for c in chunks) <= 256  # one step stays within its budget
    assert [c.tokens for c in chunks if c.seq is small.sequences[0]] == [40]  # all of it, at once


def test_a_long_prompt_is_computed_in_chunks_and_decodes_go_first():
    scheduler = Scheduler(BlockManager(4096), max_seqs=128, max_tokens=64)
    decoding = job(10, "a")
    scheduler.add(decoding)
    run(scheduler, scheduler.schedule())
    decoding.sequences[0].tokens.append(5)  # it sampled a token: now it decodes
    long = job(200, "b")
    scheduler.add(long)
    seen = []
    while long.sequences[0].computed < 200:
        chunks = scheduler.schedule()
        assert sum(c.tokens for c in chunks) <= 64
        assert chunks[0].seq is decoding.sequences[0] and chunks[0].tokens == 1
        seen.append(sum(c.tokens for c in chunks if c.seq is long.sequences[0]))
        run(scheduler, chunks)
        decoding.sequences[0].tokens.append(5)
    # In chunks over several steps; a token costs more the longer its context (its attention).
    assert sum(seen) == 200 and len(seen) > 3 and seen[0] > seen[-2]


def test_admission_waits_for_free_blocks_and_a_job_that_would_never_fit_is_not_admitted():
    blocks = BlockManager(10, prefix_cache=False)  # 160 tokens
    scheduler = Scheduler(blocks, max_seqs=128, max_tokens=1024)
    first, second = job(100, "a", branches=2), job(100, "b", branches=2)
    scheduler.add(first)
    scheduler.add(second)
    chunks = scheduler.schedule()
    assert [c.seq for c in chunks] == [first.sequences[0]]  # 7 blocks + 1 spare: 2 left, 8 needed
    assert blocks.used == 8 and not second.admitted
    for s in first.sequences:
        blocks.release(s)
    scheduler.running.clear()
    assert [c.seq for c in scheduler.schedule()] == [second.sequences[0]]


def test_when_blocks_run_out_the_youngest_sequence_is_preempted_and_held_branches_go_first():
    blocks = BlockManager(5, prefix_cache=False)
    scheduler = Scheduler(blocks, max_seqs=128, max_tokens=1024)
    old, young = job(16, "a"), job(16, "b")
    for j in (old, young):
        scheduler.add(j)
    run(scheduler, scheduler.schedule())  # both prompts fill a block each
    for j in (old, young):
        j.forked = True
        j.sequences[0].tokens.append(7)
    held = job(16, "c")
    scheduler.add(held)
    run(scheduler, scheduler.schedule())  # old and young take a block each for their decode; held its prompt
    held.forked = True
    held.sequences[0].tokens.append(7)
    scheduler.finish(held.sequences[0])
    assert blocks.free == 0 and held.sequences[0].blocks
    for j in (old, young):
        j.sequences[0].tokens += [7] * 16  # their next decode needs a new block each
        j.sequences[0].computed = 32
    chunks = scheduler.schedule()
    assert not held.sequences[0].blocks  # the held branch lost its KV first (it keeps its tokens)
    assert [c.seq for c in chunks] == [old.sequences[0]]  # then the youngest was preempted
    assert young.sequences[0].status.value == "waiting" and scheduler.preempted == 1


def test_a_request_with_nothing_running_may_preempt_a_big_one_that_holds_the_pool():
    blocks = BlockManager(20, prefix_cache=False)
    scheduler = Scheduler(blocks, max_seqs=128, max_tokens=4096)
    big = [job(100, "big") for _ in range(5)]  # 7 blocks each: two fit (a request of five items)
    for j in big:
        scheduler.add(j)
    run(scheduler, scheduler.schedule())
    assert blocks.free == 6 and sum(j.admitted for j in big) == 2
    small = job(120, "small")  # 8 blocks: only if the big one gives some back
    scheduler.add(small)
    chunks = scheduler.schedule()
    assert [c.seq for c in chunks] == [small.sequences[0]]
    assert big[1].sequences[0].status.value == "waiting" and scheduler.preempted == 1  # its youngest
    run(scheduler, chunks)
    more = job(120, "small")  # the same request again: it has something running, so it waits
    scheduler.add(more)
    assert scheduler.schedule() == [] and scheduler.preempted == 1
