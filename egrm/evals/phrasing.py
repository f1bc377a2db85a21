"""How people ask small arithmetic questions and how they answer them: the forms of
`builtin:arith-mixed`.

A question form names the operation its numbers go through; a response form writes a number
the way a person (or a policy) might: bare, in a sentence, as an equation, with worked steps,
with a thousands separator, with units, hedged, boxed. Some question forms are `seen=False`:
they appear only in the test split, so evaluation measures phrasings the judge never trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from num2words import num2words

SYMBOLS = {"+": ("+",), "-": ("-", "−"), "*": ("*", "×", "x", "·")}


@dataclass(frozen=True, slots=True)
class QuestionForm:
    text: str  # {a} and {b} are the operands; {A} and {B} the operands in words; {s} a symbol
    unit: str = ""  # what the answer counts ("pencils"); "$" for money
    seen: bool = True  # False: test split only (an unseen phrasing)

    def render(self, a: int, b: int, rng: random.Random, op: str) -> str:
        return self.text.format(a=a, b=b, A=words(a), B=words(b), s=rng.choice(SYMBOLS[op]))


def words(n: int) -> str:
    return num2words(n).replace(",", "")


Q = QuestionForm
QUESTION_FORMS: dict[str, tuple[QuestionForm, ...]] = {
    "+": (
        Q("What is {a} {s} {b}?"),
        Q("What is {a}{s}{b}?"),
        Q("Compute {a} {s} {b}."),
        Q("{a} {s} {b} = ?"),
        Q("What is {a} plus {b}?"),
        Q("Add {a} and {b}."),
        Q("What is the sum of {a} and {b}?"),
        Q("Calculate: {a} {s} {b}"),
        Q("Evaluate ${a} {s} {b}$."),
        Q("What is {A} plus {B}?"),
        Q("Sam has {a} apples and buys {b} more. How many apples does Sam have now?", "apples"),
        Q("A bus carries {a} passengers and {b} more get on. How many passengers are on the bus?", "passengers"),
        Q("There are {a} red balls and {b} blue balls in a bag. How many balls are there in all?", "balls"),
        Q("How much is {a} and {b} together?", seen=False),
        Q("Find the total of {a} and {b}.", seen=False),
        Q("A farm has {a} cows and {b} sheep. How many animals does it have?", "animals", seen=False),
    ),
    "-": (
        Q("What is {a} {s} {b}?"),
        Q("Compute {a}{s}{b}."),
        Q("{a} {s} {b} = ?"),
        Q("What is {a} minus {b}?"),
        Q("Subtract {b} from {a}."),
        Q("What is the difference between {a} and {b}?"),
        Q("Calculate: {a} {s} {b}"),
        Q("What is {A} minus {B}?"),
        Q("Tom had {a} marbles and lost {b}. How many marbles does he have left?", "marbles"),
        Q("A shop had {a} loaves of bread and sold {b}. How many loaves are left?", "loaves"),
        Q("A book has {a} pages. Maya has read {b} of them. How many pages are left to read?", "pages"),
        Q("How much is {a} take away {b}?", seen=False),
        Q("Evaluate ${a} - {b}$.", seen=False),
        Q("A tank holds {a} litres and {b} litres leak out. How many litres remain?", "litres", seen=False),
    ),
    "*": (
        Q("What is {a} {s} {b}?"),
        Q("What is {a}{s}{b}?"),
        Q("Compute {a} {s} {b}."),
        Q("{a} {s} {b} = ?"),
        Q("What is {a} times {b}?"),
        Q("Multiply {a} by {b}."),
        Q("What is the product of {a} and {b}?"),
        Q("Evaluate ${a} \\times {b}$."),
        Q("What is {A} times {B}?"),
        Q("A box holds {a} pencils. How many pencils are in {b} boxes?", "pencils"),
        Q("Each ticket costs ${a}. How much do {b} tickets cost?", "$"),
        Q("A garden has {b} rows with {a} plants in each row. How many plants are there?", "plants"),
        Q("What is {a} multiplied by {b}?", seen=False),
        Q("Calculate the product: {a} {s} {b}", seen=False),
        Q("A car travels {a} km every hour. How far does it go in {b} hours?", "km", seen=False),
    ),
}


def _sep(n: int) -> str:
    return f"{n:,}"


def _with_unit(n: str, unit: str) -> str:
    if unit == "$":
        return f"${n}"
    return f"{n} {unit}" if unit else n


def _steps(a: int, op: str, b: int, v: int) -> str:
    """Worked steps that end on v (a near miss slips on the last step, as people do)."""
    if op == "*" and b >= 10:
        hi, lo = b - b % 10, b % 10
        return f"{a} × {b} = {a} × {hi} + {a} × {lo} = {a * hi} + {a * lo} = {v}"
    if op == "*":
        hi, lo = a - a % 10, a % 10
        return f"{a} × {b} = {hi} × {b} + {lo} × {b} = {hi * b} + {lo * b} = {v}"
    tens = b - b % 10
    first = a + tens if op == "+" else a - tens
    return f"{a} {op} {b} = {a} {op} {tens} {op} {b % 10} = {first} {op} {b % 10} = {v}"


@dataclass(frozen=True, slots=True)
class ResponseForm:
    name: str
    write: Callable[[int, str, int, int, str], str]  # (a, op, b, proposed, unit) -> response


R = ResponseForm
SYMBOL_OUT = {"+": "+", "-": "-", "*": "×"}

# Every form here holds the number as digits: math-verify reads the final answer off it.
RESPONSE_FORMS: tuple[ResponseForm, ...] = (
    R("bare", lambda a, op, b, v, u: str(v)),
    R("sentence", lambda a, op, b, v, u: f"The answer is {v}."),
    R("equation", lambda a, op, b, v, u: f"{a} {SYMBOL_OUT[op]} {b} = {v}"),
    R("steps", lambda a, op, b, v, u: _steps(a, op, b, v) + "."),
    R("separator", lambda a, op, b, v, u: f"That makes {_sep(v)}."),
    R("units", lambda a, op, b, v, u: _with_unit(_sep(v), u or "in total")),
    R("hedge", lambda a, op, b, v, u: f"I think it's {v}, but I'm not completely sure."),
    R("boxed", lambda a, op, b, v, u: f"$\\boxed{{{v}}}$"),
    R("markdown", lambda a, op, b, v, u: f"**{v}**"),
    R("explained", lambda a, op, b, v, u: f"Let me work it out: {_steps(a, op, b, v)}. So the result is {v}."),
)

NON_ANSWERS = ("I don't know.", "I can't work that out.", "It depends.", "That is hard to say.", "Sorry, no idea.")

# The responses the judge's Yes/No follow-up turn learns from (`egrm train-grm`): no digits in them.
# The verifier reads the words form as a number (text2num) since the shipped judge learnt it, so
# served, the follow-up meets it only where no number reads (a lone "one" or "two").
UNCHECKABLE_FORMS: tuple[ResponseForm, ...] = (
    R("words", lambda a, op, b, v, u: f"The answer is {words(v)}."),
    R("no answer", lambda a, op, b, v, u: random.Random(a * 1000 + b).choice(NON_ANSWERS)),
)
