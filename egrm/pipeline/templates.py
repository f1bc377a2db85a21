"""What the judge is asked (one solve-first prompt), and how each template presents its judgement.

The judge answers the question itself before it sees any response: its M short answers are its
own result ("364"), so they agree when it can compute the result in one go and scatter when it
cannot, and consensus is taken over what it computed. A small judge shown the response first
copies its number (measured: the untuned and a tuned 135M judge said Yes to every near miss),
and its samples agree whatever the truth. The response enters only afterwards: compared with the
judge's answer by a verifier where both can be read as math, otherwise shown in a follow-up turn
that asks for a Yes/No verdict.

Every template rests on that one judgement, the probability p that a response is right:
`verdict` answers Yes/No with reward p; `score` maps p to 1..10; `pairwise` judges both
responses the same way (no order, so no position bias) and rewards P(A is the better one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from egrm.pipeline.types import JudgeItem


class TemplateName(str, Enum):
    VERDICT = "verdict"
    SCORE = "score"
    PAIRWISE = "pairwise"


Message = dict[str, str]


@dataclass(frozen=True, slots=True)
class JudgePrompt:
    system: str
    question: str  # the last line of the user turn: answer it yourself
    verdict_question: str  # the follow-up turn's question, after the response
    reasoning_cue: str  # long path: what follows the short answer to start reasoning
    verdicts: tuple[str, str] = ("Yes", "No")
    answer_tokens: int = 40  # room for the judge's own short answer (83-47=83-40-7=43-7=43-3-4=40-4=36: 33 tokens)

    def messages(self, item: JudgeItem) -> list[Message]:
        parts = [f"Question:\n{item.prompt}"]
        if item.reference:
            parts.append(f"Reference answer:\n{item.reference}")
        parts.append(self.question)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": "\n\n".join(parts)}]

    def followup(self, response: str) -> str:
        """The turn that shows the response and asks for the verdict."""
        return f"Response:\n{response}\n\n{self.verdict_question}"

    OWN_ANSWER = 2  # the judge's own answer's place in conversation(): what follows it is the follow-up

    def conversation(self, item: JudgeItem, own_answer: str, response: str) -> list[Message]:
        """The whole exchange up to the verdict: encoded after OWN_ANSWER, the follow-up turn."""
        return [
            *self.messages(item),
            {"role": "assistant", "content": own_answer},
            {"role": "user", "content": self.followup(response)},
        ]

    def verdict_of(self, text: str) -> str | None:
        """The verdict a Yes/No answer holds: its first Yes or No (an engine without constrained
        answers may write more around it)."""
        found = _VERDICT.search(text)
        return found.group(1).capitalize() if found else None


_VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)

JUDGE = JudgePrompt(
    system="You are a strict judge. Answer the question yourself first; then judge the response you are shown.",
    question="Answer the question yourself first, briefly.",
    verdict_question="Is the response correct? Answer Yes or No.",
    reasoning_cue="\nLet me check step by step.\n",
)


@dataclass(frozen=True, slots=True)
class Template:
    """How a judgement is presented: the answer shown and the reward, from p per response."""

    name: TemplateName
    answers: tuple[str, ...]
    present: Callable[[Sequence[float], Sequence[bool]], tuple[str, float]]  # (p, verdict) per response
    responses: int = 1  # how many responses an item holds

    @property
    def needs_response_b(self) -> bool:
        return self.responses == 2


def _verdict(p: Sequence[float], right: Sequence[bool]) -> tuple[str, float]:
    return ("Yes" if right[0] else "No"), p[0]


def _score(p: Sequence[float], right: Sequence[bool]) -> tuple[str, float]:
    """1..10, linear in p: a calibrated probability mapped onto the scale people read."""
    return str(1 + int(9 * p[0] + 0.5)), p[0]  # halves round up


def _pairwise(p: Sequence[float], right: Sequence[bool]) -> tuple[str, float]:
    """A, B or tie, by each response's own probability of being right; reward = P(A better),
    taken as 0.5 + (p_A - p_B) / 2 (1 when A is surely right and B surely wrong)."""
    answer = "A" if p[0] > p[1] else "B" if p[1] > p[0] else "tie"
    return answer, 0.5 + (p[0] - p[1]) / 2


TEMPLATES: dict[TemplateName, Template] = {
    TemplateName.VERDICT: Template(TemplateName.VERDICT, ("Yes", "No"), _verdict),
    TemplateName.SCORE: Template(TemplateName.SCORE, tuple(str(s) for s in range(1, 11)), _score),
    TemplateName.PAIRWISE: Template(TemplateName.PAIRWISE, ("A", "B", "tie"), _pairwise, responses=2),
}


def get_template(name: str | TemplateName) -> Template:
    return TEMPLATES[TemplateName(name)]
