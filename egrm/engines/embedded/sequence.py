"""Where a branch lives: a sequence of tokens with its KV blocks and its status; a job owns M of them.

A sample job starts as one sequence, the prompt. When the prompt's last token is computed the job
forks: M sequences share the prompt's KV blocks (only a partly filled last block is copied) and
each samples its first token from the same logits. From then on every branch is a sequence like
any other: each step feeds it the tokens whose KV is not yet computed (a prompt chunk, or the
token it sampled last) and samples the next one. Continuing a branch starts a new sequence from
it (its tokens, then the appended ones) that takes over the KV the branch still holds, as the
M branches of a prompt share theirs; the branch itself stays as it was, so one branch can be
continued many times (the follow-up of every response judged against one sample). A branch's
blocks are kept for as long as someone holds its handle.
"""

from __future__ import annotations

import itertools
import random
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from egrm.engines.base import BranchParams, FinishReason
from egrm.engines.embedded.constraint import TrieNode

_ids = itertools.count()
# A sequence whose job is over draws nothing until begin() gives it a generator again: they all
# hold this one instead of 2.5 KB of Mersenne Twister state each (held branches are many).
_SPENT = random.Random(0)


class Status(Enum):
    WAITING = "waiting"  # needs KV blocks before it can run (new, continued, or preempted)
    RUNNING = "running"  # holds its blocks; each step computes some of its tokens
    FINISHED = "finished"  # done for its job; its blocks stay while its handle is held


@dataclass(eq=False, slots=True)
class Sequence:
    tokens: list[int]  # everything it attends to: the prompt, then what it sampled and was appended
    params: BranchParams
    group: int  # the branches forked from one prompt share it (and a row of attention, packed)
    id: int = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    computed: int = 0  # leading tokens whose KV is in the blocks
    blocks: list[int] = field(default_factory=list)  # tokens[i]'s KV is in blocks[i // block_size]
    keys: list[int] = field(default_factory=list)  # content keys of its full blocks, chained (kv_cache)
    job: Job | None = field(default=None, repr=False)  # the job decoding it now
    # What the current job produced: tokens[start:], their log-probs, and why it stopped.
    start: int = 0
    logprobs: list[float] = field(default_factory=list)
    text: str | None = None  # set at a stop string; decoded from the new tokens otherwise
    finish: FinishReason | None = None
    node: TrieNode | None = None  # position in the allowed-answer trie; None when unconstrained
    rng: random.Random = field(default_factory=random.Random)
    prompt_tokens: int = 0  # context at the job's start (what Branch reports)
    cached_tokens: int = 0  # of which KV was already there (kept, or served from the prefix cache)
    released: bool = False  # its handle is gone: free the blocks once the current job ends
    kv: Any = None  # KV kept outside the pool: the generic forward's own cache (model_runner.py)
    parent: Sequence | None = field(default=None, repr=False)  # the branch it continues, until it has its KV

    @property
    def uncomputed(self) -> int:
        return len(self.tokens) - self.computed

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.start :]

    def begin(self, params: BranchParams, job: Job) -> None:
        """Start a job on this sequence: what it samples from here on, and how."""
        self.params, self.job, self.start = params, job, len(self.tokens)
        self.logprobs, self.text, self.finish = [], None, None
        self.rng = random.Random(params.seed) if params.seed is not None else random.Random()
        self.prompt_tokens, self.cached_tokens = len(self.tokens), self.computed
        self.status = Status.WAITING  # the scheduler admits it once blocks for its new tokens are free


class Handle:
    """What Branch.handle holds: the sequence to continue. Engine.release(handles) frees the
    sequence's KV; should a handle be dropped unreleased, its finalizer does it (engine.py)."""

    __slots__ = ("sequence", "finalizer", "__weakref__")

    def __init__(self, sequence: Sequence):
        self.sequence = sequence
        self.finalizer: Any = None  # weakref.finalize, detached by an explicit release


@dataclass(eq=False, slots=True)
class Job:
    """One sample or continue call: its branch sequences and the future its caller awaits."""

    sequences: list[Sequence] = field(repr=False)
    params: list[BranchParams]
    tag: Any = None  # the client request it serves: the scheduler shares prefill fairly among tags
    forked: bool = True  # False for a sample job until its prompt is computed and split into M branches
    handles: list[Handle] = field(default_factory=list)  # a continuation keeps its branches alive until it runs
    future: Future = field(default_factory=Future)  # answered by the engine's front, only there
    admitted: bool = False  # counted in the engine's batch statistics once

    @classmethod
    def sample(cls, prompt: list[int], params: list[BranchParams], tag: Any = None) -> Job:
        """The prompt is computed once, by the first branch; the others join it at the fork."""
        job = cls([], params, tag, forked=False)
        group = next(_ids)
        for p in params:
            seq = Sequence(list(prompt), p, group)
            seq.begin(p, job)
            job.sequences.append(seq)
        return job

    @classmethod
    def continuation(cls, handles: list[Handle], appended: list[int], params: list[BranchParams], tag: Any) -> Job:
        """A new sequence per handle: its branch's tokens, then the appended ones. A finished
        branch's tokens never change, so they are read here; its KV is taken on the model thread."""
        job = cls([], params, tag, handles=list(handles))
        for h, p in zip(handles, params, strict=True):
            seq = Sequence([*h.sequence.tokens, *appended], p, h.sequence.group, parent=h.sequence)
            seq.begin(p, job)
            job.sequences.append(seq)
        return job

    @property
    def branches(self) -> int:
        return len(self.params)

    def detach(self) -> None:
        """The job is over: its sequences forget it, so no cycle handle -> sequence -> job -> handle
        keeps a dropped branch (and its KV) alive until the garbage collector runs."""
        for seq in self.sequences:
            seq.job, seq.rng = None, _SPENT
        self.handles = []

    @property
    def done(self) -> bool:
        return self.forked and all(s.status is Status.FINISHED for s in self.sequences)
