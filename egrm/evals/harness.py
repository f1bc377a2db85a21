"""Run labelled items through the real pipeline, routed and forced down each path.

Every item runs once per mode with the same seed. Seeded branches sample the same tokens whatever
else shares the engine, so the routed run's short samples are the always-short run's, and when it
routes long its candidates are the forced long run's (with early stop, the `early` run's): the
modes differ only by routing. `long` is the baseline: every candidate reasons to the end.
The mode order rotates from item to item so that no mode always runs on a warmer cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from egrm.config import temperature_ladder
from egrm.evals.data import LabelledItem
from egrm.pipeline.consensus import tally
from egrm.pipeline.routing import RoutingPolicy
from egrm.pipeline.service import RewardPipeline
from egrm.pipeline.types import ConsensusMode, ItemResult, JudgeOptions, PathMode, Route

# long: every candidate reasons to the end (the baseline); early: the long path with early stop.
MODES = ("routed", "short", "long", "early")
_PATH = {"routed": PathMode.AUTO, "short": PathMode.SHORT, "long": PathMode.LONG, "early": PathMode.LONG}
# ladder: the method's 0.6..1.0; fixed: one temperature for every branch; nucleus: hot, narrow top-p.
STRATEGIES = ("ladder", "fixed", "nucleus")
ESTIMATORS = tuple(c.value for c in ConsensusMode)


@dataclass(frozen=True, slots=True)
class EvalConfig:
    m: int = 5
    tau: float = 0.8
    strategy: str = "ladder"
    top_p: float = 0.95
    long_max_tokens: int = 128
    long_accept: float = 0.9  # early stop (routed and early modes; 0: none, and no early mode)
    long_window: int = 1
    seed: int = 1234
    modes: tuple[str, ...] = MODES
    consensus: str = "sampled"  # the estimator routing uses; both are measured on every item
    extra: int = 5  # adaptive M's extra samples, drawn on every forced short run (read offline)
    policy: RoutingPolicy | None = None  # routes the routed mode instead of tau
    # Cost under load (load.py): this many clients send the first load_questions items' groups of
    # load_group responses, per policy; 0 clients: no load run.
    load_clients: int = 0
    load_questions: int = 48
    load_group: int = 4

    @property
    def run_modes(self) -> tuple[str, ...]:
        """The modes to run: the early-stop one only where early stop is on."""
        return tuple(m for m in self.modes if m != "early" or self.long_accept > 0)

    def sampling(self) -> tuple[list[float], float]:
        """Per-branch temperatures and the shared top-p of a strategy."""
        if self.strategy == "ladder":
            return temperature_ladder(self.m), self.top_p
        if self.strategy == "fixed":
            return [0.7] * self.m, self.top_p
        if self.strategy == "nucleus":
            return [1.0] * self.m, 0.9
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {self.strategy!r}")

    def options(self, mode: str, template: str, seed: int) -> JudgeOptions:
        temperatures, top_p = self.sampling()
        return JudgeOptions(
            temperatures=temperatures,
            top_p=top_p,
            tau=self.tau,
            path=_PATH[mode],
            template=template,
            return_samples=True,
            seed=seed,
            long_max_tokens=self.long_max_tokens,
            long_accept=0.0 if mode == "long" else self.long_accept,
            long_window=self.long_window,
            consensus=ConsensusMode(self.consensus),
            with_exact=True,
            policy=self.policy,
            extra_always=self.extra if mode == "short" else 0,
        )


@dataclass(slots=True)
class ModeRun:
    """One item through one mode."""

    answer: str | None
    route: Route | None
    latency_ms: float
    prompt_tokens: int
    completion_tokens: int
    candidates: list[str] = field(default_factory=list)  # long path: the reasoning texts
    reward: float | None = None
    verdict_by: str | None = None  # what decided (equivalence, judge, reference)
    extra_ms: float = 0.0  # of latency_ms: adaptive M's extra samples (forced short runs draw them)
    samples_drawn: int = 0
    extra_tokens: int = 0  # of completion_tokens: adaptive M's extra samples'

    @property
    def base_ms(self) -> float:
        """The latency without adaptive M's extra samples (what a policy that draws none pays)."""
        return self.latency_ms - self.extra_ms

    @property
    def base_tokens(self) -> int:
        """The completion tokens without adaptive M's extra samples."""
        return self.completion_tokens - self.extra_tokens

    @classmethod
    def of(cls, result: ItemResult) -> ModeRun:
        return cls(
            answer=result.answer,
            route=result.route,
            latency_ms=result.timings.total_ms,
            prompt_tokens=result.usage.prompt_tokens,
            completion_tokens=result.usage.completion_tokens,
            candidates=[c.reasoning for c in result.candidates or []],
            reward=result.reward,
            verdict_by=result.judgements[0].by.value if result.judgements else None,
            extra_ms=result.timings.extra_ms,
            samples_drawn=result.samples_drawn,
            extra_tokens=result.extra_tokens,
        )


@dataclass(frozen=True, slots=True)
class Estimate:
    """One consensus estimator's reading of an item's short answers (the same in every mode)."""

    consensus: float
    answer: str | None  # what the short path answers when routed by this estimator
    vote: str | None = None  # the answer it holds the response against (a class of equal answers)


@dataclass(slots=True)
class ItemOutcome:
    item: LabelledItem
    estimates: dict[str, Estimate]  # per estimator: sampled (the vote) and exact
    runs: dict[str, ModeRun]
    routed_by: str = "sampled"

    @property
    def consensus(self) -> float:
        return self.estimates[self.routed_by].consensus

    @property
    def majority(self) -> str | None:
        return self.estimates[self.routed_by].answer

    def correct(self, mode: str) -> bool:
        return self.runs[mode].answer == self.item.gold

    @property
    def long_mode(self) -> str:
        """The run a policy's long route costs: the long path with early stop where it ran."""
        return "early" if "early" in self.runs else "long"


async def evaluate(
    pipeline: RewardPipeline,
    items: Sequence[LabelledItem],
    config: EvalConfig,
    progress: Callable[[], None] = lambda: None,
) -> list[ItemOutcome]:
    """Each item through each mode in config.modes, one at a time (latencies are not shared)."""
    outcomes = []
    modes = config.run_modes
    for index, item in enumerate(items):
        seed = config.seed + 10_000 * index
        order = modes[index % len(modes) :] + modes[: index % len(modes)]
        results: dict[str, ItemResult] = {}
        for mode in order:
            results[mode] = await pipeline.score_item(item.judge_item(), config.options(mode, item.template, seed))
        runs = {mode: ModeRun.of(r) for mode, r in results.items()}
        # The forced short run reads both estimators' short answers; other runs may lack one.
        read = results["short"] if "short" in results else results[modes[0]]
        outcomes.append(ItemOutcome(item, estimates(read, config.m), runs, config.consensus))
        progress()
    return outcomes


def estimates(result: ItemResult, m: int) -> dict[str, Estimate]:
    """Each estimator's consensus and short-path answer, from an item run with with_exact: the M
    samples' vote, the greedy answer's probability, and (when extra samples were drawn) the vote
    with adaptive M's extra ones."""
    if result.exact is None or result.samples is None:
        raise ValueError("evaluation needs the samples and the exact estimate of every item")
    vote = tally([s.vote for s in result.samples[:m]])
    out = {
        "sampled": Estimate(vote.consensus, result.majority_answer, vote.majority),
        "exact": Estimate(result.exact.probability, result.exact.answer, result.exact.vote),
    }
    if result.extended is not None:
        out["all"] = Estimate(result.extended.consensus, result.extended.answer)
    return out
