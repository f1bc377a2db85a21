"""Training sequences for the judge, laid out exactly as the pipeline will feed the model.

The verdict template is solve-first. At serving time the pipeline samples the judge's own answer
(it ends at EOS); on the short path it then appends the follow-up turn that shows the response
and reads a constrained verdict; on the long path it first appends the reasoning cue and samples
reasoning (it ends at EOS), then the follow-up turn and the verdict. The engine never keeps EOS
in a branch's context, so a sequence holds the pieces back to back and the label after the own
answer and after the reasoning is EOS, while the next input is what the pipeline appends.

Two shapes, drawn per item: short (own answer, follow-up, verdict: it compares the response
with the own answer) and long (own answer, reasoning, follow-up, verdict: it compares with the
reasoning's result). Some own answers are wrong on purpose and not learnt (labels masked): on
the long path every sample is continued, also the ones that computed wrongly, and the reasoning
must compute afresh; on the short path the verdict must follow the answer it was given.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.evals.data import LabelledItem, near_miss, question_of
from app.judge.targets import proposed_of, reasoning, verdict
from app.pipeline.templates import JudgeTemplate

IGNORE = -100  # label of a position that carries no loss (torch's cross-entropy default)

Render = Callable[[list[dict[str, str]]], str]


@dataclass(frozen=True, slots=True)
class Segment:
    ids: list[int]
    learn: bool  # whether the model is trained to write these tokens
    then_eos: bool = False  # the model should stop after them (EOS label; the input goes on)


@dataclass(frozen=True, slots=True)
class Example:
    ids: list[int]
    labels: list[int]  # per position: the token to predict next, or IGNORE

    @property
    def learnt_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE)


def layout(segments: Sequence[Segment], eos_id: int) -> Example:
    """Concatenate segments; label each learnt token at the position before it."""
    ids: list[int] = []
    labels: list[int] = []
    for seg in segments:
        if seg.learn and not ids:
            raise ValueError("a learnt segment needs something before it to predict it from")
        start = len(ids)
        ids += seg.ids
        labels += [IGNORE] * len(seg.ids)
        if seg.learn:
            for k, token in enumerate(seg.ids):
                labels[start + k - 1] = token
            if seg.then_eos:
                labels[-1] = eos_id
    return Example(ids, labels)


@dataclass(frozen=True, slots=True)
class Mix:
    short_share: float = 0.35  # sequences of the short shape (no reasoning)
    wrong_own: float = 0.3  # sequences whose own answer is a near miss (not learnt)


def example(
    item: LabelledItem,
    template: JudgeTemplate,
    encode: Callable[[str], list[int]],
    render: Render,
    eos_id: int,
    rng: random.Random,
    mix: Mix,
) -> Example:
    """One builtin:arith item in the short or the long shape."""
    question, proposed = question_of(item), proposed_of(item)
    wrong = rng.random() < mix.wrong_own
    own = near_miss(question.value, rng) if wrong else question.value
    judge_item = item.judge_item()
    head = [
        Segment(encode(render(template.messages(judge_item))), learn=False),
        Segment(encode(str(own)), learn=not wrong, then_eos=True),
    ]
    followup = Segment(encode(template.followup_text(judge_item, render)), learn=False)
    if rng.random() < mix.short_share:
        return layout([*head, followup, Segment(encode(verdict(own, proposed)), learn=True)], eos_id)
    work = [
        Segment(encode(template.reasoning_cue), learn=False),
        Segment(encode(reasoning(question)), learn=True, then_eos=True),
    ]
    return layout([*head, *work, followup, Segment(encode(item.gold), learn=True)], eos_id)
