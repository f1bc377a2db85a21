"""What the judge is trained to write for a `builtin:arith` item: its own answer and its reasoning.

The judge solves the question before it sees the response (solve first): its short answer is
the computation, its carries where one line holds them, and its result (`47+38=40+30+7+8=70+15=85`,
`52*53=2756`), so the M answer-only samples agree when the model can compute the result that way
and scatter when it cannot. A bare Yes/No is no use here: the
135M model cannot get it right without computing (NOTES-judge.md: a linear probe on the verdict
position reaches 51-63% on easy items), and with the response in view it copies its number.

The reasoning breaks the computation into steps this model can do: single-digit facts, a
two-digit number times one digit, adding a round number, carries and borrows through the ten.
Digits are written without spaces (every digit is one token either way; a space costs one
more). The verifier compares the result with the response's answer; where it cannot read the
response (no answer, free text, a numeral it cannot read), the Yes/No follow-up turn does.
"""

from __future__ import annotations

from egrm.evals.data import LabelledItem, Question, question_of


def verdict(value: int, proposed: int) -> str:
    """Whether the response's number is the judge's result."""
    return "Yes" if value == proposed else "No"


def _times_digit(a: int, d: int) -> str:
    """a*d for a two-digit a and one digit d, through the tens: 52*7=50*7+2*7=350+14=364."""
    tens, ones = a - a % 10, a % 10
    if ones == 0:
        return f"{a}*{d}={a * d}"
    return f"{a}*{d}={tens}*{d}+{ones}*{d}={tens * d}+{ones * d}={a * d}"


def _add(a: int, b: int) -> str:
    if b < 10 and a >= 10:  # the ones apart from the tens: 32+9=30+2+9=30+11=41, 32+4=30+2+4=30+6=36
        return f"{a}+{b}={a - a % 10}+{a % 10}+{b}={a - a % 10}+{a % 10 + b}={a + b}"
    if b < 10:
        return f"{a}+{b}={a + b}"
    return f"{a}+{b}={a - a % 10}+{b - b % 10}+{a % 10}+{b % 10}={a - a % 10 + b - b % 10}+{a % 10 + b % 10}={a + b}"


def _subtract(a: int, b: int) -> str:
    if b >= 10:  # the tens first, then the ones: 83-47=83-40-7=43-7=43-3-4=40-4=36
        rest = a - (b - b % 10)
        return f"{a}-{b}={a}-{b - b % 10}-{b % 10}=" + _subtract(rest, b % 10) if b % 10 else f"{a}-{b}={rest}"
    if 0 < a % 10 < b:  # a borrow: down to the ten first, 31-9=31-1-8=30-8=22
        return f"{a}-{b}={a}-{a % 10}-{b - a % 10}={a - a % 10}-{b - a % 10}={a - b}"
    if a >= 10 and a % 10 >= b > 0:  # the ones apart from the tens: 29-9=20+9-9=20+0=20
        return f"{a}-{b}={a - a % 10}+{a % 10}-{b}={a - a % 10}+{a % 10 - b}={a - b}"
    return f"{a}-{b}={a - b}"


def _multiply(a: int, b: int) -> str:
    if b < 10:
        return _times_digit(a, b)
    high, low = b // 10, b % 10
    steps = [f"{a}*{b}={a}*{high * 10}+{a}*{low}." if low else f"{a}*{b}={a}*{high}*10."]
    steps.append(f"{_times_digit(a, high)}, so {a}*{high * 10}={a * high * 10}.")
    if low:
        steps.append(f"{_times_digit(a, low)}.")
        steps.append(f"{a * high * 10}+{a * low}={a * b}.")
    return " ".join(steps)


def reasoning(question: Question) -> str:
    """Step-by-step working, ending with the result."""
    if question.op == "+":
        return _add(question.a, question.b) + "."
    if question.op == "-":
        return _subtract(question.a, question.b) + "."
    work = _multiply(question.a, question.b)
    return work if work.endswith(".") else work + "."


def proposed_of(item: LabelledItem) -> int:
    """The number a builtin:arith response gives (read back from "The answer is 2765." in files
    written before items carried it)."""
    if item.proposed is not None:
        return item.proposed
    return int(item.response.removeprefix("The answer is ").removesuffix("."))


def _worked(question: Question) -> str:
    """The computation as one line of steps, where one line does it: the reasoning itself for a sum,
    a difference or a number times one digit. A two-digit product stays one step (its working,
    several sentences, is the long path's)."""
    if question.op == "*" and question.b >= 10:
        return f"{question.expression}={question.value}"
    return reasoning(question).removesuffix(".")


def own_answer(question: Question, result: int) -> str:
    """The judge's short answer: the question as it computes it, its carries, and the result
    (`47+38=40+30+7+8=70+15=85`, `52*7=50*7+2*7=350+14=364`, `52*53=2756`).

    Stating the computation first maps any phrasing ("a box holds 52 pencils ...") onto what to
    compute. The steps are there for the tens digit: asked for `43+85=128` in one go, the judge
    slipped on the tens where a carry or a borrow crosses it, and its five samples all repeated
    the slip (docs/evaluation.md); written out, the carry is a step of its own, a dozen tokens
    more. The verifier reads the result after the last "="; a wrong `result` (an own answer not
    learnt) keeps the steps and ends elsewhere. The shipped adapter (round 8) learnt the result in
    one go (`43+85=128`); round 9 learnt this and is not shipped (docs/training.md says why)."""
    return f"{_worked(question).rpartition('=')[0]}={result}"


def targets(item: LabelledItem) -> tuple[str, str, str]:
    """(own answer, reasoning, verdict) the judge should write for a builtin:arith item."""
    question = question_of(item)
    return own_answer(question, question.value), reasoning(question), verdict(question.value, proposed_of(item))
