"""The reward pipeline, read aloud: render -> sample -> compare -> vote -> route -> (reason, score)
-> judge -> present."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace

from egrm.aio import gather_or_cancel, within_deadline
from egrm.engines.base import Engine, WorkTag
from egrm.pipeline.cluster import ClusterLimits, ClusterStore
from egrm.pipeline.judgement import by_equivalence, by_exact, by_verdicts
from egrm.pipeline.longpath import followup, judge_long, usage_of, verdicts
from egrm.pipeline.question import QuestionWork, derived_seed, judge_question, question_key, restored, stored
from egrm.pipeline.routing import RoutingPolicy
from egrm.pipeline.scorer import Scorer
from egrm.pipeline.sharing import SharedWork, SharingLimits
from egrm.pipeline.templates import JUDGE, get_template
from egrm.pipeline.types import (
    ConsensusMode,
    ExtendedVote,
    ItemResult,
    JudgeItem,
    Judgement,
    JudgeOptions,
    Route,
    Sample,
    Shared,
    Timings,
    Usage,
    VerdictBy,
)
from egrm.pipeline.verifier import AnswerChecker, Comparison, MathVerifyChecker

# Tokenizing megabytes would stall every other request on the event loop: big batches go to a thread.
_OFF_LOOP_CHARS = 50_000


class PromptTooLongError(Exception):
    """An item's rendered judge prompt has more tokens than the request allows."""

    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(f"items[{index}] renders to a {tokens}-token judge prompt; the limit is {limit}")
        self.index, self.tokens, self.limit = index, tokens, limit


def timed_out(deadline_s: float) -> ItemResult:
    message = f"not judged within the request's deadline ({deadline_s:g} s); the other items were"
    return ItemResult(None, None, None, 0.0, {}, error=message, error_type="timeout_error")


class RewardPipeline:
    def __init__(
        self,
        engine: Engine,
        scorer: Scorer,
        checker: AnswerChecker | None = None,
        sharing: SharingLimits | None = None,
        policy: RoutingPolicy | None = None,
        cluster: ClusterLimits | None = None,
    ):
        """checker: how answers are compared; by default math-verify in a worker process of its own
        (started on first use, stopped by close()). sharing: keep each question's work for every
        response to it, across requests (sharing.py); None: each item computes its own. policy: the
        judge's routing policy (routing.py), which the service's requests route by; None: tau.
        cluster: with sharing, the Redis store the replicas share question work through
        (cluster.py); None: this process's window alone."""
        self.engine = engine
        # The judge's name in question keys, read once: a remote engine learns its server's own
        # name for the model on its first call, and a key that changed then would split the work
        # of one question between the requests before and after it.
        self.judge_name = engine.model_name
        self.policy = policy
        self.scorer = scorer
        self.checker = checker if checker is not None else MathVerifyChecker()
        self.questions: SharedWork[QuestionWork] | None = None
        if sharing is not None:
            # Degraded work (the scorer failed) serves the requests waiting for it, not later ones.
            self.questions = SharedWork(
                sharing,
                size_of=lambda w: w.nbytes,
                keep=lambda w: not w.degraded,
                release=lambda w: engine.release(w.handles),
            )
        self.cluster: ClusterStore[QuestionWork] | None = None
        if sharing is not None and cluster is not None:
            self.cluster = ClusterStore(cluster, encode=stored, keep=lambda w: not w.degraded)

    async def close(self) -> None:
        """Stops the answer checker and the store's client (the engine and the scorer belong to
        whoever built them)."""
        await self.checker.close()
        if self.cluster is not None:
            await self.cluster.close()

    async def score(
        self,
        items: Sequence[JudgeItem],
        options: JudgeOptions,
        max_prompt_tokens: int | None = None,
        deadline_s: float | None = None,
        tag: object = None,
    ) -> list[ItemResult]:
        """One result per item, in order; an item whose input the engine rejects gets an error.
        tag: the client request they serve (the engine shares its steps fairly among tags).

        Every prompt is rendered and tokenized once, here; an item over max_prompt_tokens raises
        PromptTooLongError before any model work starts. At deadline_s (from the call) the items
        still running are cancelled and get a timeout error; the finished ones keep their results.
        """
        start = time.perf_counter()
        prompts = await self.encode_prompts(items)
        if max_prompt_tokens is not None:
            for i, size in enumerate(await self._judged_tokens(items, options.template, prompts)):
                if size > max_prompt_tokens:
                    raise PromptTooLongError(i, size, max_prompt_tokens)
        calls = [
            self._score_or_error(item, ids, options, deadline_s, tag) for item, ids in zip(items, prompts, strict=True)
        ]
        if deadline_s is None:
            # One item failing the whole request (e.g. the engine queue is full) stops the others
            # instead of leaving their work running for nobody (their queued jobs are cancelled).
            return await gather_or_cancel(calls)
        left = max(0.0, deadline_s - (time.perf_counter() - start))
        return await within_deadline(calls, left, lambda: timed_out(deadline_s))

    async def encode_prompts(self, items: Sequence[JudgeItem]) -> list[list[int]]:
        """The token ids of each item's judge prompt (what the engine will prefill)."""

        def encode() -> list[list[int]]:
            return [self.engine.encode_chat(JUDGE.messages(item)) for item in items]

        chars = sum(len(i.prompt) + len(i.reference or "") for i in items)
        return await asyncio.to_thread(encode) if chars > _OFF_LOOP_CHARS else encode()

    async def _judged_tokens(
        self, items: Sequence[JudgeItem], template: str, prompts: Sequence[list[int]]
    ) -> list[int]:
        """Tokens of what the judge may read of each item: its prompt and the follow-up turn that
        shows the longest response (not in the prompt, but the response is the bulk of an item)."""
        count = get_template(template).responses

        def tokens() -> list[int]:
            return [
                len(ids) + max(len(followup(self.engine, item, r)) for r in responses(item, count))
                for item, ids in zip(items, prompts, strict=True)
            ]

        chars = sum(len(i.response) + len(i.response_b or "") for i in items)
        return await asyncio.to_thread(tokens) if chars > _OFF_LOOP_CHARS else tokens()

    async def _score_or_error(
        self, item: JudgeItem, prompt_ids: list[int], options: JudgeOptions, deadline_s: float | None, tag: object
    ) -> ItemResult:
        try:
            return await self.score_item(item, options, prompt_ids, deadline_s, tag)
        except ValueError as exc:  # e.g. the prompt does not fit the model's context
            return ItemResult(reward=None, answer=None, route=None, consensus=0.0, votes={}, error=str(exc))

    async def score_item(
        self,
        item: JudgeItem,
        options: JudgeOptions,
        prompt_ids: list[int] | None = None,
        deadline_s: float | None = None,
        tag: object = None,
    ) -> ItemResult:
        """deadline_s: the deadline the request brings (admission of new shared work reads it);
        tag: the client request it serves."""
        start = time.perf_counter()
        template = get_template(options.template)
        answers = responses(item, template.responses)
        result = await self._by_reference(item, answers)
        if result is None:
            if prompt_ids is None:
                (prompt_ids,) = await self.encode_prompts([item])
            async with self.question(item, options, prompt_ids, deadline_s, tag) as (work, shared):
                # Pairwise: both responses against the same work, so their order cannot matter.
                runs = await gather_or_cancel([self.judge(work, item, r, options, tag) for r in answers])
            result = merged(runs)
            shared = work.origin if shared is Shared.COMPUTED else shared  # another replica's work
            if shared is Shared.COMPUTED:
                result.usage.add(work.usage)  # the work was this item's: its tokens count here
            else:
                result.shared = shared
        result.answer, result.reward = template.present(
            [j.p for j in result.judgements], [j.right for j in result.judgements]
        )
        result.timings.total_ms = (time.perf_counter() - start) * 1000
        return result

    @asynccontextmanager
    async def question(
        self,
        item: JudgeItem,
        options: JudgeOptions,
        prompt_ids: list[int],
        deadline_s: float | None = None,
        tag: object = None,
    ) -> AsyncIterator[tuple[QuestionWork, Shared]]:
        """The judge's work on the item's question, computed here or shared (sharing.py), for as
        long as the block judges against it; then its branches are released (shared work: once
        nobody uses it and it has left the window)."""
        key = question_key(self.judge_name, prompt_ids, options)
        questions, cluster = self.questions, self.cluster
        if questions is not None and options.seed is None:
            # The same samples wherever and whenever the question is judged (derived_seed).
            options = replace(options, seed=derived_seed(key))
        # Shared work may outlive this request (the grace after a deadline): the engine is told
        # whether anybody still waits for it, and runs it behind live work when nobody does.
        work_tag = WorkTag(tag, lambda: questions.waited(key)) if questions is not None else tag

        def judged_here() -> Awaitable[QuestionWork]:
            return judge_question(
                self.engine, self.scorer, self.checker, key, item.prompt, prompt_ids, options, work_tag
            )

        async def judged_once() -> QuestionWork:
            """Across replicas: read, awaited, or judged here under the question's lock."""
            assert cluster is not None
            cue_ids = self.engine.encode(JUDGE.reasoning_cue)
            work, _ = await cluster.get(
                key, judged_here, lambda data, how: restored(data, key, prompt_ids, cue_ids, how)
            )
            return work

        compute = judged_here if cluster is None else judged_once

        if questions is None:
            work = await compute()
            try:
                yield work, Shared.COMPUTED
            finally:
                self.engine.release(work.handles)
            return
        async with questions.lease(key, compute, deadline_s, owner=tag) as leased:
            yield leased

    async def _by_reference(self, item: JudgeItem, answers: Sequence[str]) -> ItemResult | None:
        """A reference that reads as math decides by itself, against every response that does."""
        if not item.reference:
            return None
        comparison = await self.checker.compare([item.reference], answers)
        (key,) = comparison.answer_keys
        if not all(comparison.checkable(key, i) for i in range(len(answers))):
            return None  # the judge reads the reference in its prompt
        judgements = [
            Judgement(float(k == key), k == key, VerdictBy.REFERENCE, key, a)
            for k, a in zip(comparison.response_keys, comparison.response_answers, strict=True)
        ]
        return ItemResult(None, None, Route.REFERENCE, 1.0, {}, judgements=judgements)

    async def judge(
        self, work: QuestionWork, item: JudgeItem, response: str, options: JudgeOptions, tag: object = None
    ) -> ItemResult:
        """One response against the judge's work on its question, on the route the work took."""
        result = ItemResult(
            reward=None,
            answer=None,
            route=work.route,
            consensus=work.consensus,
            votes=dict((work.tally_all if work.by_all and work.tally_all else work.tally).votes),
            exact=work.exact,
            samples_drawn=work.samples_drawn,
            extra_tokens=work.extra_tokens,
            timings=Timings(sample_ms=work.sample_ms, extra_ms=work.extra_ms),
        )
        if options.return_samples:
            result.samples = [
                Sample(work.branches[i].text, _temperature(options, n), work.keys[i]) for n, i in enumerate(work.voters)
            ]
        # The short path's judgement: the vote's (its leader continues when the judge must say
        # Yes/No; with adaptive M's extra samples, the extended vote's) and, when asked for, the
        # exact estimate's (its greedy branch continues). Evaluation (with_exact) reads each
        # wherever it can; the long path keeps the leader.
        short = work.route is Route.SHORT
        by_exact_estimate = work.exact is not None and options.consensus is ConsensusMode.EXACT
        routing = "exact" if by_exact_estimate else "all" if work.by_all else "sampled"
        wanted = {routing} if short else set()
        if options.with_exact:  # every vote it can, where the route is short; the exact one anywhere
            wanted |= {"exact", "sampled", "all"} if short else {"exact"}
        wanted -= set() if work.exact is not None else {"exact"}
        wanted -= set() if work.tally_all is not None else {"all"}
        found: dict[str, Judgement] = {}
        if wanted:
            comparison = await self.checker.compare(work.texts, [response])
            for vote in sorted(wanted):
                found[vote] = await self._short(work, item, response, comparison, vote, result.usage, tag)
        if "exact" in found and work.exact is not None:
            result.exact = replace(work.exact, answer=found["exact"].verdict)
        if work.tally_all is not None:
            verdict = found["all"].verdict if "all" in found else None
            result.extended = ExtendedVote(work.tally_all.consensus, work.samples_drawn, verdict)
        result.majority_answer = found["sampled"].verdict if "sampled" in found else None
        if short:
            result.judgements = [found[routing]]
            return result
        reasoned = work.reasoned
        assert reasoned is not None  # the long route reasons
        judgement, verdict_texts, usage = await self._memo(
            work, ("long", response), lambda: judge_long(self.engine, self.checker, reasoned, item, response, tag)
        )
        result.judgements = [judgement]
        result.candidates = [replace(c, verdict=v) for c, v in zip(reasoned.candidates, verdict_texts, strict=True)]
        result.degraded = reasoned.degraded
        result.usage.add(usage)
        result.timings.reasoning_ms, result.timings.scorer_ms = reasoned.reasoning_ms, reasoned.scorer_ms
        return result

    async def _short(
        self,
        work: QuestionWork,
        item: JudgeItem,
        response: str,
        comparison: Comparison,
        vote: str,
        usage: Usage,
        tag: object = None,
    ) -> Judgement:
        """The short path's judgement of the response against a vote's answer: the M samples'
        ("sampled"), with adaptive M's extra ones ("all"), or the greedy one's ("exact"): by
        equivalence where checkable, else by that answer's branch's Yes/No follow-up."""
        voters = list(range(work.m)) if vote != "all" else work.voters
        keys = [work.keys[i] for i in voters]
        if vote == "exact":
            assert work.exact is not None
            answer, branch = work.exact.vote, work.greedy
            decided = by_exact(comparison, keys, answer, work.exact.probability)
        else:
            counted = work.tally_all if vote == "all" else work.tally
            assert counted is not None
            answer = counted.majority
            branch = work.leader(voters, answer)
            decided = by_equivalence(comparison, keys, [1.0] * len(keys), answer)
        if decided is not None:
            return decided
        if branch is None:  # no sample gave an answer to hold the response against
            return Judgement(0.0, False, VerdictBy.JUDGE, None, comparison.response_answers[0])

        async def ask() -> tuple[Judgement, list[str | None], Usage]:
            (verdict,) = await verdicts(self.engine, followup(self.engine, item, response), [branch], tag)
            return by_verdicts([verdict], [1.0], comparison, answer), [], usage_of([verdict])

        judgement, _, spent = await self._memo(work, (vote, response), ask)
        usage.add(spent)
        return judgement

    async def _memo(
        self,
        work: QuestionWork,
        key: tuple[str, str],
        ask: Callable[[], Awaitable[tuple[Judgement, list[str | None], Usage]]],
    ) -> tuple[Judgement, list[str | None], Usage]:
        """A response's follow-up judgement, memoised on the work: the first one asked stands for
        every later (or concurrent) copy of the same response, which spends no tokens on it."""
        if key in work.followups:
            judgement, texts, _ = work.followups[key]
            return judgement, texts, Usage()
        answer = await ask()
        kept = work.followups.setdefault(key, answer)
        if self.questions is not None:
            self.questions.refresh(work.key, work)
        return kept if kept is answer else (kept[0], kept[1], Usage())


def responses(item: JudgeItem, count: int) -> list[str]:
    """The responses an item holds for a template: its response, and response_b for pairwise."""
    if count == 2 and item.response_b is None:
        raise ValueError("the pairwise template needs response_b")
    return [item.response, item.response_b or ""][:count]


def merged(runs: Sequence[ItemResult]) -> ItemResult:
    """Pairwise: the two responses' runs as one result. With the same seed their samples, votes
    and route are the same; the judgements and the work are both."""
    first = runs[0]
    for other in runs[1:]:
        first.judgements += other.judgements
        first.usage.add(other.usage)
        first.degraded = first.degraded or other.degraded
    return first


def _temperature(options: JudgeOptions, n: int) -> float:
    """The temperature of the n-th voter: the ladder, then again for adaptive M's extra samples."""
    return options.temperatures[n % len(options.temperatures)]
