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
    # Solve first: the judge answers the question itself before it sees the response (the short
    # answer is free text ending at EOS, and the M samples vote on it), then the response comes in
    # a follow-up turn that asks for the verdict. Seeing the response first, a small judge copies
    # its number (measured: every near miss copied); blind, its samples agree when it can compute
    # the answer and scatter when it cannot, so consensus is taken over what it computed.
    solve_first: bool = False
    verdict_question: str = ""  # solve first: the follow-up turn's question, after the response
    # Room for the longest short answer: "10" and a leading space; or the judge's own answer.
    answer_tokens: int = 4
    # Long path: what follows the short answer to start reasoning, and what asks for the final one
    # (solve first: the follow-up turn instead).
    reasoning_cue: str = "\nLet me check step by step.\n"
    final_cue: str = "\nFinal answer:"

    def user_message(self, item: JudgeItem) -> str:
        parts = [f"Question:\n{item.prompt}"]
        if self.needs_response_b:
            parts += [f"Response A:\n{item.response}", f"Response B:\n{item.response_b}"]
        elif not self.solve_first:
            parts.append(f"Response:\n{item.response}")
        if item.reference:
            parts.append(f"Reference answer:\n{item.reference}")
        parts.append(self.question)
        return "\n\n".join(parts)

    def messages(self, item: JudgeItem) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user_message(item)}]

    def followup(self, item: JudgeItem) -> str:
        """Solve first: the turn that shows the response and asks for the verdict."""
        return f"Response:\n{item.response}\n\n{self.verdict_question}"

    def conversation(self, item: JudgeItem, own_answer: str) -> list[dict[str, str]]:
        """Solve first: the whole exchange up to the verdict (how the follow-up is rendered)."""
        return [
            *self.messages(item),
            {"role": "assistant", "content": own_answer},
            {"role": "user", "content": self.followup(item)},
        ]

    def followup_text(self, item: JudgeItem, render: Callable[[list[dict[str, str]]], str]) -> str:
        """Solve first: the text that closes the judge's own answer and asks for its verdict, in the
        model's chat format (`render` is the engine's chat template, applied around a marker)."""
        _, found, tail = render(self.conversation(item, _MARK)).partition(_MARK)
        if not found:
            raise ValueError("the chat template dropped the judge's own answer from the conversation")
        return tail

    def extract(self, text: str) -> str | None:
        """The canonical answer in a sample's text, or None when it holds none."""
        match = self.pattern.search(text)
        if match is None:
            return None
        found = match.group(1).casefold()
        return next(a for a in self.answers if a.casefold() == found)

    def vote(self, text: str) -> str | None:
        """What a short answer votes for: the canonical answer; solve first, the judge's own
        answer, normalised (spacing, case, closing punctuation); None when there is none."""
        if not self.solve_first:
            return self.extract(text)
        own = " ".join(text.split()).rstrip(" .,:;!").casefold()
        return own or None

    def reward(self, answer: str) -> float:
        return self.reward_of(answer)


_MARK = "\u241f"  # stands in for the judge's own answer while the follow-up turn is rendered

_SCORES = tuple(str(s) for s in range(1, 11))

TEMPLATES: dict[TemplateName, JudgeTemplate] = {
    TemplateName.VERDICT: JudgeTemplate(
        name=TemplateName.VERDICT,
        system="You are a strict judge. Answer the question yourself first; then judge the response you are shown.",
        question="Answer the question yourself first, briefly.",
        answers=("Yes", "No"),
        pattern=re.compile(r"\b(yes|no)\b", re.IGNORECASE),
        reward_of=lambda a: 1.0 if a == "Yes" else 0.0,
        solve_first=True,
        verdict_question="Is the response correct? Answer Yes or No.",
        answer_tokens=16,
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
