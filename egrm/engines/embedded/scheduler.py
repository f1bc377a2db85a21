"""What each engine step computes, and every change a step makes to a sequence.

A step is planned here (plan), run by the model runner, and its drawn tokens come back here
(update): every change to a sequence's state (computed KV, blocks, fork, tokens, finish) is made in
this file, the home of the sequences' lifecycle (nano-vllm's Scheduler.schedule / postprocess).

Planning: decodes first, then prompt chunks shared among client requests, within a token budget and
the KV pool's free blocks; spare work (which may turn out unneeded) only in rows a step has to spare;
work nobody waits for any more only when no live work is to be done.

- Decodes: every running sequence whose last sampled token is not computed yet gets one token.
  When the pool has no block left, a finished branch that is only held (the long path might
  continue it) loses its KV first (its tokens stay: continuing it recomputes them); then the
  youngest running sequence is preempted (back to waiting, recomputed later), so the oldest finish.
- Prompt chunks: new prompts, continuations and preempted branches. What the decodes leave of the
  step's budget is shared round-robin among client requests (tags), so a one-item request is not
  queued behind every item of a big one (a share is at least MIN_CHUNK tokens: prompts already
  started go first, then requests in order of arrival); a long prompt is computed in chunks over several steps,
  so a step stays short (a deadline or a disconnect takes effect at the next one) and other
  requests' decodes go on beside it.
- Admission: a waiting sequence is admitted once blocks for all its uncomputed tokens are free
  (plus, for a new prompt, one spare per other branch for the fork). An admitted prompt always
  completes, and memory is bounded by the pool. A request with nothing running may preempt the
  youngest sequences of others to get in, so a big request cannot hold the pool against it.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

from egrm.engines.base import BACKGROUND, LIVE, SPARE, FinishReason, rank_of, request_of
from egrm.engines.embedded.attention import FEW_QUERIES
from egrm.engines.embedded.kv_cache import BlockManager
from egrm.engines.embedded.sequence import Job, Sequence, Status

# The smallest prompt chunk a request gets in a step while others wait: shared thinner, many
# requests would each advance a few tokens a step and all finish late.
MIN_CHUNK = 128
# A step's budget counts what a token costs: its share of the weights, plus its attention over
# the context. A query among few (a decode) costs as much again over this many keys, a prompt
# chunk's query over eight times as many. Set when decode attention ran as fp32 batched matmuls
# (65 decodes over 3,800 keys took 0.5 s, as long as 1,000 prompt tokens over a short context).
# Since it runs as one SDPA call over whole blocks, a decode's key costs about half that (bf16,
# 4 branch rows of 16 queries over 3,840 keys: 4.2 against 7.9 ms a layer) and three times a
# prompt chunk's; the constants were kept, tuned with STEP_SHARE on bench_hostile: they now
# overcharge long-context decodes, which keeps such a request's steps shorter than the budget.
ATTENTION_KEYS = 256
# A request's share of a step while another request has live work is at least this many budget
# units (a decode step costs about as much time here as 50 prompt tokens: its pass over the weights),
# so a big request keeps moving beside small ones, adding about half to their steps. At 48 (a whole
# pass) a one-item request beside bench_hostile's took 815-940 ms, at 24 647-684 ms (Intel Xeon, bf16;
# bench_mixed unchanged); before spare rows counted in the share, 24 had not helped.
STEP_SHARE = 24.0
# Spare work (SpareTag) rides along while a step computes fewer sequences than this: a decode row
# costs about 1/50 of the pass over the weights that every step makes, so up to 8
# rows beside a small request add a few percent to its step. Under load, live rows fill the steps
# and spare work waits; it is aborted, never computed, when its caller finds it does not need it.
# Beside another request's live work, spare rows count in their own request's share (_share_cap):
# over a long context a row is no longer cheap (a decode over 3,800 keys added 20 ms to a 26 ms step).
SPARE_ROWS = 8
# After the last step another request shared, the requests that shared it keep their share this
# long: a small request's client answers and sends its next one in tens of milliseconds, and meanwhile
# a big request alone would start a full step (100-700 ms over long prompts) that the next one waits
# for. A request that arrives meanwhile (a sequential client's next one) is not bounded by it.
SHARE_LINGER_S = 0.25


def _cost(seq: Sequence, tokens: int) -> float:
    """Budget units per token for seq's next `tokens` tokens."""
    keys = ATTENTION_KEYS if tokens <= FEW_QUERIES else 8 * ATTENTION_KEYS
    return 1.0 + (seq.computed + tokens) / keys


def _tag(seq: Sequence) -> Any:
    """The client request seq serves: the unit the step is shared fairly among."""
    return request_of(seq.job.tag) if seq.job is not None else None


def _priority(seq: Sequence) -> int:
    """What a step computes first: LIVE, then SPARE, then BACKGROUND work (see engines/base.py)."""
    return LIVE if seq.job is None else rank_of(seq.job.tag)


def _live(seq: Sequence) -> bool:
    return _priority(seq) == LIVE


@dataclass(slots=True)
class Step:
    """One step's plan: the chunks computed, then who draws a token from which logits row (the
    rows are the chunks that complete their sequence, in order; a prompt's branches share its row)."""

    chunks: list[Chunk]
    drawing: list[Sequence] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)

    @property
    def background_tokens(self) -> int:
        """Tokens computed for work nobody waits for."""
        return sum(c.tokens for c in self.chunks if _priority(c.seq) == BACKGROUND)

    @property
    def spare_tokens(self) -> int:
        """Tokens computed for work nobody needs yet."""
        return sum(c.tokens for c in self.chunks if _priority(c.seq) == SPARE)


@dataclass(slots=True)
class StepOutput:
    """What a step changed: jobs whose branches all finished, and forks whose KV the runner copies
    (leader, followers, (source block, destination block) pairs)."""

    finished: list[Job] = field(default_factory=list)
    forks: list[tuple[Sequence, list[Sequence], list[tuple[int, int]]]] = field(default_factory=list)
    decoded: bool = False  # the step advanced a running branch by one token


@dataclass(slots=True)
class Chunk:
    """Part of a step: the next `tokens` uncomputed tokens of a sequence."""

    seq: Sequence
    tokens: int

    @property
    def completes(self) -> bool:
        """Whether this computes the sequence's last token (then it samples the next one)."""
        return self.seq.computed + self.tokens == len(self.seq.tokens)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_batch_branches: int,
        max_batch_tokens: int,
        eos_ids: frozenset[int] = frozenset(),
        text_of: Callable[[Seq[int]], str] = lambda ids: "",
        clock: Callable[[], float] = time.monotonic,
    ):
        """eos_ids end a branch; text_of decodes tokens (stop strings and a branch's text)."""
        self.blocks = blocks
        self.clock = clock
        self.shared: tuple[float, float, frozenset[Any]] = (0.0, 0.0, frozenset())  # (until, cap, requests)
        self.live_until = 0.0  # SHARE_LINGER_S after the last step with live work
        self.max_batch_branches, self.max_batch_tokens = max_batch_branches, max_batch_tokens
        self.eos_ids, self.text_of = eos_ids, text_of
        self.jobs: list[Job] = []  # in flight, oldest first
        self.waiting: OrderedDict[Any, deque[Sequence]] = OrderedDict()  # per tag, first come first served
        self.running: list[Sequence] = []  # holding blocks, oldest admission first
        self.held: OrderedDict[int, Sequence] = OrderedDict()  # finished, KV kept for their handles; LRU first
        self.preempted = 0  # sequences sent back to waiting for want of blocks

    @property
    def has_work(self) -> bool:
        return bool(self.jobs)

    @property
    def queued_jobs(self) -> int:
        """Jobs not admitted yet (read from other threads: a reading, not exact)."""
        return sum(1 for job in list(self.jobs) if not job.admitted)

    def add(self, job: Job) -> None:
        """Queue a job: a new prompt (its leader; the other branches wait for the fork) or the new
        sequences of a continuation (each has taken its branch's KV, see inherit)."""
        self.jobs.append(job)
        queued = job.sequences if job.forked else job.sequences[:1]
        self.waiting.setdefault(request_of(job.tag), deque()).extend(queued)

    def inherit(self, seq: Sequence) -> list[tuple[int, int]] | None:
        """A continuation's sequence takes the KV its branch still holds, as a fork's followers do:
        full blocks by reference, a partly filled last one copied into a block of its own. Returns
        the blocks whose KV the caller must copy; None when it took nothing (the branch's KV is gone,
        or no block is free): then it is computed, or found in the prefix cache, when admitted."""
        parent, seq.parent = seq.parent, None
        if parent is None or not parent.blocks:
            return None
        kept = self.held.pop(parent.id, None)  # not the branch's own KV to make room for its copy
        room = self._free_up(1)
        if kept is not None:
            self.held[parent.id] = kept
        if not room:
            return None
        self.blocks.allocate(seq, 1)
        return self.blocks.fork(parent, [seq])

    # --- one step -------------------------------------------------------------------------

    def plan(self) -> Step | None:
        """The next step: what each sequence computes, and who then draws a token."""
        chunks = self.schedule()
        if not chunks:
            return None
        step = Step(chunks)
        for row, c in enumerate(c for c in chunks if c.completes):
            job = c.seq.job
            assert job is not None
            drawing = job.sequences if not job.forked else [c.seq]  # the prompt's branches start together
            step.drawing += drawing
            step.rows += [row] * len(drawing)
        return step

    def update(self, step: Step, tokens: Seq[int], logprobs: Seq[float]) -> StepOutput:
        """Every sequence after the step's forward and draw: KV computed, a prompt forked into its
        branches, each drawn token appended, finished branches and jobs settled."""
        out = StepOutput()
        completed = [c.seq for c in step.chunks if c.completes]  # read before the KV counts move
        for c in step.chunks:
            out.decoded |= c.tokens == 1 == c.seq.uncomputed and c.seq.computed > 0
            c.seq.computed += c.tokens
            self.blocks.commit(c.seq)
        for seq in completed:
            job = seq.job
            if job is not None and not job.forked:  # the prompt is in: its branches start from it
                out.forks.append((seq, job.sequences[1:], self.fork(job)))
        for seq, token, logprob in zip(step.drawing, tokens, logprobs, strict=True):
            self._append(seq, token, logprob)
            if seq.finish is not None:
                self.finish(seq)
        for job in {id(s.job): s.job for s in step.drawing if s.job is not None and s.job.done}.values():
            self.jobs.remove(job)
            out.finished.append(job)
        return out

    def _append(self, seq: Sequence, token: int, logprob: float) -> None:
        """Take the drawn token; set seq.finish when the branch is done."""
        if token in self.eos_ids and not seq.params.ignore_eos:
            seq.finish = FinishReason.STOP  # EOS is not part of the branch's text or tokens
        else:
            # Appended even when it is the last: its KV is computed only if the branch is continued.
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            seq.finish = self._finish_reason(seq)
        if seq.finish is not None and seq.text is None:
            seq.text = self.text_of(seq.new_tokens)

    def _finish_reason(self, seq: Sequence) -> FinishReason | None:
        """Whether (and why) the branch is done after its latest token."""
        if seq.node is not None:
            seq.node = seq.node.children[seq.tokens[-1]]
            if seq.node.is_leaf:
                return FinishReason.STOP
        if seq.params.stop:
            text = self.text_of(seq.new_tokens)
            hits = [text.find(s) for s in seq.params.stop if s in text]
            if hits:
                seq.text = text[: min(hits)]
                return FinishReason.STOP
        if len(seq.new_tokens) >= seq.params.max_new_tokens:
            return FinishReason.LENGTH
        return None

    def schedule(self) -> list[Chunk]:
        """Live work: its decodes, then its prompt chunks, each request's share of the step bounded
        by what the smallest one needs (see _share_cap). Spare work fills the rows a step has to
        spare (SPARE_ROWS), in the blocks that are free, within its request's share of the step
        (what that request's live work left of it). Work nobody waits for (a question's work
        in its grace after a deadline) runs only in a step with no live work, in the blocks that
        are free: beside a live request's decode it would make each of that request's steps as
        long as a full prompt chunk. Within SHARE_LINGER_S of live work, a step with none (spare
        or background work) holds STEP_SHARE (the next request of a client between two would
        wait for a full one)."""
        plan: dict[int, Chunk] = {}
        budget = float(self.max_batch_tokens)
        now = self.clock()
        cap, used = self._share_cap(now), defaultdict[Any, float](float)
        budget = self._plan_decodes(plan, budget, LIVE, cap, used)
        budget = self._plan_prefills(plan, budget, LIVE, cap, used)
        if plan:
            self.live_until = now + SHARE_LINGER_S
        elif now < self.live_until:  # a client may be between two requests: keep it short
            budget = min(budget, STEP_SHARE)
        if len(plan) < SPARE_ROWS:
            budget = self._plan_decodes(plan, budget, SPARE, cap, used, rows=SPARE_ROWS)
            budget = self._plan_prefills(plan, budget, SPARE, cap, used, rows=SPARE_ROWS)
        if not plan:
            budget = self._plan_decodes(plan, budget, BACKGROUND, None, used)
            self._plan_prefills(plan, budget, BACKGROUND, None, used)
        return [c for c in plan.values() if c.tokens]

    def _share_cap(self, now: float) -> float | None:
        """The most budget units one request may take of a step while others have live work: what
        the smallest live request needs this step (its decodes, or its next prompt chunk), and at
        least STEP_SHARE. A step costs about a weights pass plus its tokens, so a one-item request
        beside a big one keeps steps near its own size: its latency is a few steps of its own, not
        a few of the big one's (which would fill every step it shares). With one request: None,
        unless another request has spare work (then that one is bounded by it), or it shared a
        step less than SHARE_LINGER_S ago (then the share it had then)."""
        need: dict[Any, float] = {}
        spare: set[Any] = set()  # the requests with spare work to do
        for seq in self.running:
            if _live(seq) and seq.status is Status.RUNNING and seq.uncomputed == 1:
                need[_tag(seq)] = need.get(_tag(seq), 0.0) + _cost(seq, 1)
            elif _live(seq) and seq.uncomputed > 1:
                n = min(seq.uncomputed, MIN_CHUNK)
                need[_tag(seq)] = need.get(_tag(seq), 0.0) + n * _cost(seq, n)
            elif _priority(seq) == SPARE and seq.status is Status.RUNNING:
                spare.add(_tag(seq))
        for tag, queue in self.waiting.items():
            first = next((s for s in queue if _live(s)), None)
            if first is not None and tag not in need:
                n = min(first.uncomputed, MIN_CHUNK)
                need[tag] = n * _cost(first, n)
            if any(_priority(s) == SPARE for s in queue):
                spare.add(tag)
        if len(need) > 1:
            cap = max(STEP_SHARE, min(need.values()))
            self.shared = (now + SHARE_LINGER_S, cap, frozenset(need))
            return cap
        # A request whose only work is spare (its first candidate read, the others run in case)
        # shares the step too: unbounded, its prompt chunks would fill the live request's steps.
        if need and spare.difference(need):
            return max(STEP_SHARE, min(need.values()))
        until, cap, requests = self.shared
        return cap if need and now < until and set(need) <= requests else None

    def _plan_decodes(
        self,
        plan: dict[int, Chunk],
        budget: float,
        priority: int,
        cap: float | None,
        used: defaultdict[Any, float],
        rows: int | None = None,
    ) -> float:
        """Decodes of one priority, requests running fewer sequences first (a one-item request is
        not behind every branch of a big one), oldest first among equals; a request past its share
        (cap) decodes one branch this step; no more than `rows` sequences in the step."""
        load = Counter(_tag(s) for s in self.running)
        decodes = [
            s for s in self.running if s.status is Status.RUNNING and s.uncomputed == 1 and _priority(s) == priority
        ]
        for seq in sorted(decodes, key=lambda s: load[_tag(s)]):
            cost, tag = _cost(seq, 1), _tag(seq)
            if (plan and cost > budget) or (rows is not None and len(plan) >= rows):
                break
            if cap is not None and used[tag] and used[tag] + cost > cap:
                continue
            if seq.status is Status.RUNNING and self._room_for(seq, seq.computed + 1, plan):
                plan[seq.id] = Chunk(seq, 1)
                budget -= cost
                used[tag] += cost
        return budget

    def _plan_prefills(
        self,
        plan: dict[int, Chunk],
        budget: float,
        priority: int,
        cap: float | None,
        used: defaultdict[Any, float],
        rows: int | None = None,
    ) -> float:
        """Prompt chunks of one priority: what is left of the budget, shared round-robin among
        requests, each within its share (cap); no more than `rows` sequences in the step."""
        progress = True
        while budget >= 1 and progress:
            tags = self._tags_with_prefill(plan, priority)
            share, progress = max(MIN_CHUNK, budget / max(1, len(tags))), False
            for tag in tags:
                mine = share if cap is None else min(share, cap - used[tag])
                if mine < 1 and used[tag]:
                    continue
                if rows is not None and len(plan) >= rows:
                    return budget
                nxt = self._next_prefill(tag, plan, priority)
                if nxt is None:
                    continue
                chunk = plan.setdefault(nxt.id, Chunk(nxt, 0))
                left = nxt.uncomputed - chunk.tokens
                per_token = _cost(nxt, chunk.tokens + min(left, int(mine)))  # its context decides
                n = max(1, min(left, int(min(mine, budget) / per_token)))
                chunk.tokens += n
                budget -= n * per_token
                used[tag] += n * per_token
                progress = True
                if budget < 1:
                    break
        return budget

    def _tags_with_prefill(self, plan: dict[int, Chunk], priority: int) -> list[Any]:
        """Requests with prompt tokens of one priority to compute, in turn: those already computing
        a prompt, then those waiting, in order of arrival."""
        going = [_tag(s) for s in self.running if s.uncomputed > 1 and self._left(s, plan) and _priority(s) == priority]
        waiting = [tag for tag, queue in self.waiting.items() if any(_priority(s) == priority for s in queue)]
        return list(dict.fromkeys(going + waiting))

    @staticmethod
    def _left(seq: Sequence, plan: dict[int, Chunk]) -> int:
        chunk = plan.get(seq.id)
        return seq.uncomputed - (chunk.tokens if chunk else 0)

    def _next_prefill(self, tag: Any, plan: dict[int, Chunk], priority: int) -> Sequence | None:
        """The request's oldest admitted prompt with tokens left this step, else its next waiting one."""
        for seq in self.running:
            if _tag(seq) == tag and seq.uncomputed > 1 and self._left(seq, plan) and _priority(seq) == priority:
                return seq
        queue = self.waiting.get(tag)
        waiting = next((s for s in queue or () if _priority(s) == priority), None)
        if queue is None or waiting is None:
            return None
        live = priority == LIVE
        admitted = self._admit(waiting, drop_held=priority != BACKGROUND)
        if not admitted and not (live and self._admit_starved(waiting, plan)):
            return None
        queue.remove(waiting)
        if not queue:
            del self.waiting[tag]  # a tag is a client request: there are always new ones
        return waiting

    # --- blocks ---------------------------------------------------------------------------

    def _admit(self, seq: Sequence, drop_held: bool = True) -> bool:
        """Give a waiting sequence blocks for all its tokens (and its job's fork spares), if free
        (drop_held: or freed by dropping held branches' KV; not for background work: spare work
        may, since without it the request it serves would wait for it later)."""
        job = seq.job
        assert job is not None
        followers = job.sequences[1:] if not job.forked else []
        if len(self.running) + 1 + len(followers) > self.max_batch_branches:
            return False
        reused = not seq.blocks
        self.blocks.reuse_prefix(seq)
        need = self.blocks.needed(seq, len(seq.tokens)) + sum(1 for f in followers if not f.blocks)
        if not (self._free_up(need) if drop_held else self.blocks.free >= need):
            if reused:
                self.blocks.release(seq)  # the prefix it took goes back, still keyed
            return False
        if reused:
            self.blocks.hit_tokens += seq.computed
        if seq.start == len(seq.tokens):  # the job's first admission: what its prompt found cached
            seq.cached_tokens = seq.computed
        self.blocks.allocate(seq, len(seq.tokens))
        for f in followers:
            self.blocks.allocate(f, 1)
        seq.status = Status.RUNNING
        self.running.append(seq)
        job.admitted = True
        return True

    def _admit_starved(self, seq: Sequence, plan: dict[int, Chunk]) -> bool:
        """A request with nothing running may take blocks from the youngest sequences of requests
        running several (they are recomputed later): one big request cannot hold the pool against it."""
        tag = _tag(seq)
        running = Counter(_tag(s) for s in self.running)
        if running[tag]:
            return False
        for victim in self._victims():
            other = _tag(victim)
            if _live(victim) and running[other] < 2:  # a request keeps its last sequence: no two take turns
                continue
            running[other] -= 1
            plan.pop(victim.id, None)
            self._preempt(victim)
            if self._admit(seq):
                return True
        return False

    def _room_for(self, seq: Sequence, tokens: int, plan: dict[int, Chunk]) -> bool:
        """Make sure seq can hold `tokens` tokens, preempting sequences not in this step's plan if
        need be (background ones first, then spare ones, then the youngest); False when seq itself
        had to be preempted, or is not live work and the blocks are not there for it."""
        need = self.blocks.needed(seq, tokens)
        if _priority(seq) == BACKGROUND and self.blocks.free < need:
            return False  # it waits for idle blocks: it takes none from anyone
        if _priority(seq) == SPARE and not self._free_up(need):
            return False  # it may take held branches' KV (an LRU cache), never a running sequence's
        while not self._free_up(need):
            victim = next(s for s in self._victims() if s.id not in plan)
            self._preempt(victim)
            if victim is seq:
                return False
        self.blocks.allocate(seq, tokens)
        return True

    def _victims(self) -> list[Sequence]:
        """Running sequences in the order they give up their blocks: work nobody waits for first,
        then spare work, then the youngest admitted (so the oldest finish)."""
        young_first = list(reversed(self.running))
        return sorted(young_first, key=lambda s: -_priority(s))  # stable: youngest first within a priority

    def _free_up(self, blocks: int) -> bool:
        """Drop held branches' KV, least recently finished first, until `blocks` are free."""
        while self.blocks.free < blocks and self.held:
            _, seq = self.held.popitem(last=False)
            self.blocks.release(seq)
        return self.blocks.free >= blocks

    def _preempt(self, seq: Sequence) -> None:
        self.preempted += 1
        self.running.remove(seq)
        self.blocks.release(seq)
        job = seq.job
        assert job is not None
        if not job.forked:
            for follower in job.sequences[1:]:
                self.blocks.release(follower)
        seq.status = Status.WAITING
        self.waiting.setdefault(request_of(job.tag), deque()).appendleft(seq)

    # --- lifecycle --------------------------------------------------------------------------

    def fork(self, job: Job) -> list[tuple[int, int]]:
        """The prompt is computed: its followers share its blocks and run. Returns blocks to copy."""
        leader, followers = job.sequences[0], job.sequences[1:]
        copies = self.blocks.fork(leader, followers)
        at = self.running.index(leader) + 1
        for seq in followers:
            seq.status = Status.RUNNING
            seq.cached_tokens = seq.prompt_tokens  # the leader computed the prompt; they reuse its KV
        self.running[at:at] = followers
        job.forked = True
        return copies

    def finish(self, seq: Sequence) -> None:
        """seq is done for its job: keep its KV for the long path while its handle is held."""
        seq.status = Status.FINISHED
        self.running.remove(seq)
        if seq.released:
            self.blocks.release(seq)
        else:
            self.held[seq.id] = seq

    def release(self, seq: Sequence) -> None:
        """seq's handle is gone: nobody will continue it."""
        seq.released = True
        if seq.status is Status.FINISHED:
            self.held.pop(seq.id, None)
            self.blocks.release(seq)

    def abort(self, job: Job) -> None:
        """The caller stopped waiting (deadline, disconnect): stop the job's sequences now and free
        their blocks (the branches a continuation started from keep theirs)."""
        if job not in self.jobs:
            return
        self.jobs.remove(job)
        tag = request_of(job.tag)
        queue = self.waiting.get(tag)
        for seq in job.sequences:
            if queue is not None and seq in queue:
                queue.remove(seq)
            if seq in self.running:
                self.running.remove(seq)
            seq.status = Status.FINISHED
            self.blocks.release(seq)  # nobody holds a handle to it yet
        if queue is not None and not queue:
            del self.waiting[tag]
        job.detach()
