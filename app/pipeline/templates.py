"""Judge templates: what the judge is asked, which answers it may give, what each is worth."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from app.pipeline.types import JudgeItem


class TemplateName(str, Enum):
    VERDICT = "verdict"
    SCORE = "score"
    PAIRWISE = "pairwise"


@dataclass(frozen=True, slots=True)
class JudgeTemplate:
    name: TemplateName
    system: str
    question: str  # the last line of the user turn: what to answer, in which form
    answers: tuple[str, ...]  # the allowed, canonical answers
    pattern: re.Pattern[str]  # finds an answer in free text (engines without constraints)
    reward_of: Callable[[str], float]  # canonical answer -> reward in [0, 1]
    needs_response_b: bool = False
    # Room for the longest answer ("10" and a leading space); the constraint stops it sooner.
    answer_tokens: int = 4
    # Long path: what follows the short answer to start reasoning, and what asks for the final one.
    reasoning_cue: str = ". Let me check this step by step.\n"
    final_cue: str = "\nFinal answer:"

    def user_message(self, item: JudgeItem) -> str:
        parts = [f"Question:\n{item.prompt}"]
        if self.needs_response_b:
            parts += [f"Response A:\n{item.response}", f"Response B:\n{item.response_b}"]
        else:
            parts.append(f"Response:\n{item.response}")
        if item.reference:
            parts.append(f"Reference answer:\n{item.reference}")
        parts.append(self.question)
        return "\n\n".join(parts)

    def messages(self, item: JudgeItem) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user_message(item)}]

    def extract(self, text: str) -> str | None:
        """The canonical answer in a sample's text, or None when it holds none."""
        match = self.pattern.search(text)
        if match is None:
            return None
        found = match.group(1).casefold()
        return next(a for a in self.answers if a.casefold() == found)

    def reward(self, answer: str) -> float:
        return self.reward_of(answer)


_SCORES = tuple(str(s) for s in range(1, 11))

TEMPLATES: dict[TemplateName, JudgeTemplate] = {
    TemplateName.VERDICT: JudgeTemplate(
        name=TemplateName.VERDICT,
        system="You are a strict judge. Decide whether the response correctly answers the question.",
        question="Is the response correct? Answer Yes or No.",
        answers=("Yes", "No"),
        pattern=re.compile(r"\b(yes|no)\b", re.IGNORECASE),
        reward_of=lambda a: 1.0 if a == "Yes" else 0.0,
    ),
    TemplateName.SCORE: JudgeTemplate(
        name=TemplateName.SCORE,
        system="You are a strict judge. Rate how well the response answers the question.",
        question="Rate the response from 1 (worst) to 10 (best). Answer with the number only.",
        answers=_SCORES,
        # 10 before 1..9, so "10" is not read as "1"; no digit may follow the number.
        pattern=re.compile(r"(?<!\d)(10|[1-9])(?!\d)"),
        reward_of=lambda a: (int(a) - 1) / 9,
    ),
    TemplateName.PAIRWISE: JudgeTemplate(
        name=TemplateName.PAIRWISE,
        system="You are a strict judge. Decide which of two responses answers the question better.",
        question="Which response is better? Answer A or B.",
        answers=("A", "B"),
        # Upper case only: a lower-case "a" is an article, not a choice.
        pattern=re.compile(r"\b([AB])\b"),
        reward_of=lambda a: 1.0 if a == "A" else 0.0,
        needs_response_b=True,
    ),
}


def get_template(name: str | TemplateName) -> JudgeTemplate:
    return TEMPLATES[TemplateName(name)]
