"""What a step computes: decodes first, prompt chunks shared among client requests, blocks bounding
it all; and the scheduler's own update after each step (no model: every drawn token is a 5)."""

from egrm.engines.base import BranchParams, FinishReason, SpareTag, WorkTag
from egrm.engines.embedded.kv_cache import BlockManager
from egrm.engines.embedded.scheduler import SHARE_LINGER_S, SPARE_ROWS, STEP_SHARE, Scheduler, Step
from egrm.engines.embedded.sequence import Job, Status

ONE = [BranchParams(temperature=0, max_new_tokens=64)]
# Another request's share of a step beside the tests' small 40-token request: STEP_SHARE budget
# units, or what the small one needs that step (its prompt: 41 units), whichever is more.
SMALL_SHARE = max(STEP_SHARE, 41.0)


def job(tokens: int, tag: object, branches: int = 1, params: list[BranchParams] = ONE) -> Job:
    return Job.sample(list(range(1, tokens + 1)), params * branches, tag)


def run(scheduler: Scheduler) -> Step:
    """One step as the engine takes it: the plan, then the scheduler's update with what was drawn."""
    step = scheduler.plan()
    assert step is not None
    scheduler.update(step, [5] * len(step.drawing), [0.0] * len(step.drawing))
    return step


def test_a_small_request_is_prefilled_beside_a_big_one_that_came_first():
    scheduler = Scheduler(BlockManager(4096), max_batch_branches=128, max_batch_tokens=256)
    for _ in range(20):
        scheduler.add(job(1000, "big"))
    small = job(40, "small")
    scheduler.add(small)
    chunks = scheduler.schedule()
    assert 40 < sum(c.tokens for c in chunks) <= 256  # one step stays within its budget
    assert [c.tokens for c in chunks if c.seq is small.sequences[0]] == [40]  # all of it, at once


def test_a_long_prompt_is_computed_in_chunks_and_decodes_go_first():
    scheduler = Scheduler(BlockManager(4096), max_batch_branches=128, max_batch_tokens=64)
    decoding = job(10, "a")
    scheduler.add(decoding)
    run(scheduler)  # its prompt, and its first drawn token: now it decodes
    long = job(200, "b")
    scheduler.add(long)
    seen = []
    while long.sequences[0].computed < 200:
        step = run(scheduler)
        assert sum(c.tokens for c in step.chunks) <= 64
        assert step.chunks[0].seq is decoding.sequences[0] and step.chunks[0].tokens == 1
        seen.append(sum(c.tokens for c in step.chunks if c.seq is long.sequences[0]))
    # In chunks over several steps; a token costs more the longer its context (its attention).
    assert sum(seen) == 200 and len(seen) > 3 and seen[0] > seen[-2]


def test_the_update_forks_a_prompt_into_its_branches_and_settles_what_finishes():
    blocks = BlockManager(64, prefix_cache=False)
    scheduler = Scheduler(blocks, max_batch_branches=128, max_batch_tokens=1024, eos_ids=frozenset({9}))
    three = job(20, "a", branches=3, params=[BranchParams(temperature=0, max_new_tokens=2)])
    scheduler.add(three)
    step = scheduler.plan()
    assert step is not None and step.drawing == three.sequences and step.rows == [0, 0, 0]  # one row, shared
    out = scheduler.update(step, [5, 9, 6], [-0.1, -0.2, -0.3])
    ((leader, followers, copies),) = out.forks  # the prompt's two full blocks shared, its tail copied
    assert leader is three.sequences[0] and followers == three.sequences[1:] and len(copies) == 2
    assert [s.blocks[:1] for s in three.sequences] == [leader.blocks[:1]] * 3
    middle = three.sequences[1]
    assert middle.finish is FinishReason.STOP and middle.new_tokens == [] and middle.status is Status.FINISHED
    assert out.finished == [] and [s.new_tokens for s in three.sequences] == [[5], [], [6]]
    step = scheduler.plan()  # the two left decode; at their second token they reach the limit
    assert step is not None and step.drawing == [three.sequences[0], three.sequences[2]]
    assert scheduler.update(step, [5, 5], [0.0, 0.0]).finished == [three] and three not in scheduler.jobs
    lengths = FinishReason.LENGTH, FinishReason.STOP, FinishReason.LENGTH
    assert tuple(s.finish for s in three.sequences) == lengths and three.sequences[0].logprobs == [-0.1, 0.0]


def test_admission_waits_for_free_blocks_and_a_job_that_would_never_fit_is_not_admitted():
    blocks = BlockManager(10, prefix_cache=False)  # 160 tokens
    scheduler = Scheduler(blocks, max_batch_branches=128, max_batch_tokens=1024)
    first, second = job(100, "a", branches=2), job(100, "b", branches=2)
    scheduler.add(first)
    scheduler.add(second)
    chunks = scheduler.schedule()
    assert [c.seq for c in chunks] == [first.sequences[0]]  # 7 blocks + 1 spare: 2 left, 8 needed
    assert blocks.used == 8 and not second.admitted
    scheduler.abort(first)  # its caller gave up: its blocks go back
    assert blocks.used == 0 and [c.seq for c in scheduler.schedule()] == [second.sequences[0]]


def test_when_blocks_run_out_the_youngest_sequence_is_preempted_and_held_branches_go_first():
    blocks = BlockManager(5, prefix_cache=False)
    scheduler = Scheduler(blocks, max_batch_branches=128, max_batch_tokens=1024)
    old, young = job(16, "a"), job(16, "b")
    for j in (old, young):
        scheduler.add(j)
    run(scheduler)  # both prompts fill a block each; each draws its first token
    held = job(16, "c", params=[BranchParams(temperature=0, max_new_tokens=1)])
    scheduler.add(held)
    run(scheduler)  # old and young take a second block for their decodes; held its prompt, then it finishes
    assert blocks.free == 0 and held.sequences[0].blocks and held not in scheduler.jobs
    while len(old.sequences[0].tokens) < 33:  # fill their second blocks
        run(scheduler)
    step = scheduler.plan()  # both now need a third block
    assert step is not None
    assert not held.sequences[0].blocks  # the held branch lost its KV first (it keeps its tokens)
    assert [c.seq for c in step.chunks] == [old.sequences[0]]  # then the youngest was preempted
    assert young.sequences[0].status is Status.WAITING and scheduler.preempted == 1


def test_a_request_with_nothing_running_may_preempt_a_big_one_that_holds_the_pool():
    blocks = BlockManager(20, prefix_cache=False)
    scheduler = Scheduler(blocks, max_batch_branches=128, max_batch_tokens=4096)
    big = [job(100, "big") for _ in range(5)]  # 7 blocks each: two fit (a request of five items)
    for j in big:
        scheduler.add(j)
    run(scheduler)
    assert blocks.free == 6 and sum(j.admitted for j in big) == 2
    small = job(120, "small")  # 8 blocks: only if the big one gives some back
    scheduler.add(small)
    step = run(scheduler)
    assert small.sequences[0] in [c.seq for c in step.chunks]
    assert big[1].sequences[0].status is Status.WAITING and scheduler.preempted == 1  # its youngest
    more = job(120, "small")  # the same request again: it has something running, so it waits
    scheduler.add(more)
    step = scheduler.plan()
    assert step is not None and more.sequences[0] not in [c.seq for c in step.chunks]
    assert scheduler.preempted == 1


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Waited:
    """A question's work: waited for until its request's deadline passes."""

    def __init__(self) -> None:
        self.waiters = 1

    def __call__(self) -> bool:
        return self.waiters > 0


def test_work_nobody_waits_for_runs_only_in_steps_with_no_live_work():
    scheduler = Scheduler(BlockManager(4096), max_batch_branches=128, max_batch_tokens=256)
    waited = Waited()
    orphan = job(1000, WorkTag("hostile", waited))
    scheduler.add(orphan)
    run(scheduler)  # still waited for: its first chunk
    waited.waiters = 0  # its request's deadline passed: its grace runs
    polite = job(300, "polite", params=[BranchParams(temperature=0, max_new_tokens=3)])
    scheduler.add(polite)
    steps = []
    while polite in scheduler.jobs:
        steps.append(run(scheduler))
    # The live request's prompt chunks and its decodes (one token a step) run alone.
    assert all(s.background_tokens == 0 for s in steps) and [c.tokens for c in steps[-1].chunks] == [1]
    step = run(scheduler)  # idle: the orphan goes on
    assert [c.seq for c in step.chunks] == [orphan.sequences[0]] and step.background_tokens > 0
    scheduler.add(job(40, "polite"))  # a live request again: the orphan stops for it
    assert run(scheduler).background_tokens == 0
    waited.waiters = 1  # a retry joined it: live again, shared fairly
    assert orphan.sequences[0] in {c.seq for c in scheduler.schedule()}


def test_work_nobody_waits_for_runs_in_short_steps_a_moment_after_live_work():
    """A polite client between two requests has no live work: the orphan's full step then would
    be what its next request waits for."""
    clock = Clock()
    scheduler = Scheduler(BlockManager(4096), max_batch_branches=128, max_batch_tokens=512, clock=clock)
    waited = Waited()
    waited.waiters = 0
    orphan = Job.sample(list(range(1000, 3000)), ONE, WorkTag("hostile", waited))
    scheduler.add(orphan)
    polite = job(40, "polite", params=[BranchParams(temperature=0, max_new_tokens=2)])
    scheduler.add(polite)
    while polite in scheduler.jobs:
        assert run(scheduler).background_tokens == 0
    step = run(scheduler)
    assert 0 < step.background_tokens <= STEP_SHARE  # just after live work: a short step
    clock.now += SHARE_LINGER_S
    assert run(scheduler).background_tokens > 300  # idle a while: the step is the orphan's


def test_work_nobody_waits_for_gives_up_its_blocks_first_and_takes_none():
    blocks = BlockManager(10, prefix_cache=False)  # 160 tokens
    scheduler = Scheduler(blocks, max_batch_branches=128, max_batch_tokens=4096)
    waited = Waited()
    orphan = job(120, WorkTag("hostile", waited))  # 8 blocks
    scheduler.add(orphan)
    run(scheduler)
    waited.waiters = 0
    live = job(60, "polite")  # 4 blocks: only if the orphan gives some back
    scheduler.add(live)
    step = run(scheduler)
    assert [c.seq for c in step.chunks] == [live.sequences[0]]
    assert orphan.sequences[0].status is Status.WAITING and scheduler.preempted == 1
    # Back in waiting, it is not admitted while the blocks it needs are held by live work.
    step = run(scheduler)
    assert orphan.sequences[0].status is Status.WAITING and step.background_tokens == 0


def test_beside_a_small_request_a_big_one_takes_at_most_the_step_share():
    scheduler = Scheduler(BlockManager(4096), max_batch_branches=256, max_batch_tokens=512)
    big = [job(600, "big") for _ in range(8)]
    for j in big:
        scheduler.add(j)
    alone = scheduler.schedule()  # alone, the big request fills the step
    assert sum(c.tokens for c in alone) > 300
    run(scheduler)
    small = job(40, "small", branches=5, params=[BranchParams(temperature=0, max_new_tokens=8)])
    scheduler.add(small)
    steps = []
    while small in scheduler.jobs:
        steps.append(run(scheduler))
    # Each step the small request takes part in: its own work, and of the big one's (a few of its
    # prompt tokens) at most the share, not the rest of the 512.
    for step in steps:
        big_tokens = sum(c.tokens for c in step.chunks if c.seq.job.tag == "big")
        assert 0 < big_tokens <= SMALL_SHARE, [(c.seq.job.tag, c.tokens) for c in step.chunks]
    assert len(steps) <= 10  # its prompt in a step, then its decodes: it is not queued behind the big one


def test_beside_a_small_request_a_big_ones_spare_work_counts_in_its_share():
    """Spare rows are cheap beside a short context, not beside a long one (a decode over 3,800 keys
    cost a small request's step 20 ms more): a request whose live work took its share of the step
    gets no spare rows in it."""
    scheduler = Scheduler(BlockManager(4096), max_batch_branches=256, max_batch_tokens=512)
    needed = Waited()
    needed.waiters = 0
    decode = [BranchParams(temperature=0, max_new_tokens=64)]
    spares = job(40, SpareTag("big", needed), branches=2, params=decode)
    scheduler.add(spares)
    run(scheduler)  # its prompt: now its two branches decode
    for _ in range(8):
        scheduler.add(job(600, "big"))
    run(scheduler)
    assert all(s.status is Status.RUNNING for s in spares.sequences)  # decoding, in rows to spare
    small = job(40, "small", branches=5, params=[BranchParams(temperature=0, max_new_tokens=8)])
    scheduler.add(small)
    while small in scheduler.jobs:
        step = run(scheduler)
        assert step.spare_tokens == 0, [(c.seq.job.tag, c.tokens) for c in step.chunks]
        assert any(c.seq.job.tag == "big" for c in step.chunks)  # its live work keeps moving


def test_spare_work_of_a_request_with_no_live_work_takes_at_most_the_share_and_short_steps_after():
    """A long request between its live calls (its scorer reading the first candidate) has only
    spare work left: beside one small live request it takes at most the share a live request would,
    and just after live work its steps are short (the small client's next request would wait for a
    full one), as work nobody waits for."""
    clock = Clock()
    scheduler = Scheduler(BlockManager(8192), max_batch_branches=256, max_batch_tokens=512, clock=clock)
    needed = Waited()
    needed.waiters = 0
    for _ in range(4):
        scheduler.add(job(600, SpareTag("big", needed)))
    small = job(40, "small", branches=5, params=[BranchParams(temperature=0, max_new_tokens=8)])
    scheduler.add(small)
    steps = []
    while small in scheduler.jobs:
        steps.append(run(scheduler))
        clock.now += 0.03
    assert all(step.spare_tokens <= SMALL_SHARE for step in steps), [step.spare_tokens for step in steps]
    assert any(step.spare_tokens for step in steps)  # it still moves, in rows to spare
    assert 0 < run(scheduler).spare_tokens <= STEP_SHARE  # the small one has gone a moment ago
    clock.now += SHARE_LINGER_S
    assert run(scheduler).spare_tokens > 300  # idle a while: the step is the spare work's


def test_a_big_request_keeps_its_share_a_moment_after_a_small_one_left_but_a_newcomer_does_not():
    """Between a small client's requests (its answer, its next request: tens of ms) the big request
    alone would start a full step the next one waits for; for SHARE_LINGER_S it keeps its share."""
    clock = Clock()
    scheduler = Scheduler(BlockManager(8192), max_batch_branches=256, max_batch_tokens=512, clock=clock)
    for _ in range(8):
        scheduler.add(job(600, "big"))
    small = job(40, "small", branches=5, params=[BranchParams(temperature=0, max_new_tokens=4)])
    scheduler.add(small)
    while small in scheduler.jobs:
        run(scheduler)
        clock.now += 0.03

    def big_tokens() -> int:
        return sum(c.tokens for c in run(scheduler).chunks if c.seq.job.tag == "big")

    assert 0 < big_tokens() <= STEP_SHARE  # the small one has gone a moment ago
    clock.now += SHARE_LINGER_S
    assert big_tokens() > 300  # long enough alone: the step is its own again
    # A request that arrives alone (a sequential client's next one) never takes the share it left.
    small_again = job(40, "small 2")
    scheduler.add(small_again)
    while small_again in scheduler.jobs:
        run(scheduler)
    for j in [j for j in scheduler.jobs if j.tag == "big"]:
        scheduler.abort(j)
    newcomer = Job.sample(list(range(1000, 1400)), ONE, "next")  # no prefix in common with the others
    scheduler.add(newcomer)
    assert [c.tokens for c in run(scheduler).chunks] == [400]


def test_spare_work_rides_in_rows_a_step_has_to_spare_and_is_live_once_needed():
    scheduler = Scheduler(BlockManager(4096), max_batch_branches=128, max_batch_tokens=512)
    needed = Waited()
    needed.waiters = 0
    decode = [BranchParams(temperature=0, max_new_tokens=64)]
    window = job(40, "request", params=decode)
    spares = job(40, SpareTag("request", needed), branches=4, params=decode)
    scheduler.add(window)
    scheduler.add(spares)
    run(scheduler)  # both prompts: five rows, fewer than a step has to spare
    step = run(scheduler)
    assert {c.seq for c in step.chunks} == {*window.sequences, *spares.sequences} and step.spare_tokens == 4
    # Live rows fill the steps (other clients' requests): the spares wait, holding their blocks.
    crowd = [job(20, f"client {i}", params=decode) for i in range(SPARE_ROWS)]
    for j in crowd:
        scheduler.add(j)
    run(scheduler)
    for _ in range(3):
        step = run(scheduler)
        assert step.spare_tokens == 0 and not {c.seq for c in step.chunks} & set(spares.sequences)
    needed.waiters = 1  # the window did not decide: the caller waits for them now, as live work
    step = run(scheduler)
    assert set(spares.sequences) <= {c.seq for c in step.chunks} and step.spare_tokens == 0


def test_spare_work_gives_up_its_blocks_before_live_work():
    blocks = BlockManager(10, prefix_cache=False)  # 160 tokens
    scheduler = Scheduler(blocks, max_batch_branches=128, max_batch_tokens=4096)
    needed = Waited()
    needed.waiters = 0
    spare = job(120, SpareTag("request", needed))  # 8 blocks
    scheduler.add(spare)
    run(scheduler)
    live = job(60, "other")  # 4 blocks: only if the spare gives some back
    scheduler.add(live)
    step = run(scheduler)
    assert [c.seq for c in step.chunks] == [live.sequences[0]]
    assert spare.sequences[0].status is Status.WAITING and scheduler.preempted == 1


def test_spare_work_may_take_held_branches_kv_but_never_a_running_sequences():
    blocks = BlockManager(10, prefix_cache=False)  # 160 tokens
    scheduler = Scheduler(blocks, max_batch_branches=128, max_batch_tokens=4096)
    finished = job(100, "earlier", params=[BranchParams(temperature=0, max_new_tokens=1)])  # 7 blocks
    scheduler.add(finished)
    run(scheduler)
    assert finished.sequences[0].status is Status.FINISHED and blocks.free == 3  # held: it might be continued
    needed = Waited()
    needed.waiters = 0
    spare = job(60, SpareTag("request", needed))  # 4 blocks: only if the held branch gives its KV up
    scheduler.add(spare)
    step = run(scheduler)
    assert [c.seq for c in step.chunks] == spare.sequences and not finished.sequences[0].blocks
    # A running sequence keeps its blocks: the spare waits for them instead.
    live = job(80, "live", params=[BranchParams(temperature=0, max_new_tokens=64)])  # 5 blocks of the 6 left
    scheduler.add(live)
    other = job(60, SpareTag("request", needed))  # 4 more: only by preempting someone
    scheduler.add(other)
    for _ in range(3):
        run(scheduler)
    assert other.sequences[0].status is Status.WAITING and live.sequences[0].status is Status.RUNNING
