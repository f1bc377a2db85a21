"""Answer equivalence: whether two answers are the same, however each is written.

math-verify (Hugging Face's verifier; what veRL, TRL and OpenRLHF math rewards use) reads the
final answer out of text ("The answer is 1,776." -> 1776, "$\\boxed{42}$" -> 42) and compares
answers as math (1776 = 1,776 = 1776.0; 1/2 = 0.5). A text in which it reads nothing is read
again with its numbers in words written as digits (text2num: "five hundred and two" -> 502,
"minus twelve" -> -12), so a number in words is checked as one, and its wording never reaches
the judge. An answer it cannot read as math (free text, "Paris"; a lone "one" or "two", which
text2num leaves as words: "one of them") is compared as normalised text among the judge's own
answers, and a response it cannot read (free text, "XLII") is not checkable: the judge's Yes/No
follow-up decides it.

An answer counts as math only when it is a value: a number as written (12, -3, 0.75, 1,776,
3/4, \\frac{3}{4}, 42%), not an expression still to compute. math-verify would evaluate "88-32"
to 56, so a response that restates the question ("What is 88 minus 32?" / "88-32") would equal
the right answer without answering: it is read, it matches nothing, and it is judged wrong.

The responses are written by the policy under training, so they are hostile input: sympy can
take unbounded time on some ("9^9^9^9"). Every comparison runs in a worker process with a
deadline; one that runs past it kills the worker (the pool starts a fresh one), and its texts
count as unreadable.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import re
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from pebble import ProcessExpired

log = logging.getLogger(__name__)

# Markup tags (<b>, </s>, <|im_end|>, <filename>) are not part of an answer, and math-verify gives up
# on a text that starts with one: they are read as spaces, so markup cannot hide a wrong answer
# from the verifier (sending it to the judge's Yes/No instead).
_TAG = re.compile(r"</?\|?[A-Za-z_][\w.\-]*\|?>")

# A sign in words, once text2num wrote the number as digits ("minus 12"); not after a number,
# where it is a difference ("88 minus 32" reads as 32, as it does written in digits).
_SIGN = re.compile(r"(?<!\d)(?<!\d )\b(?:minus|negative) +(?=\d)", re.IGNORECASE)
# num2words and careful writers put a comma after a scale word ("one thousand, seven hundred"),
# where text2num would end the number (1000, 776).
_SCALE_COMMA = re.compile(r"\b(thousand|million|billion),", re.IGNORECASE)

# math-verify's own limits, inside the worker (its signal-based timeouts work in a process's main
# thread); the pool's deadline catches what they cannot interrupt (a huge integer power in C).
_PARSE_TIMEOUT_S = 1
_CALL_DEADLINE_S = 5.0


@dataclass(frozen=True, slots=True)
class Comparison:
    """The judge's answers grouped by equivalence, and each response placed among them."""

    answer_keys: list[str | None]  # per judge answer: its class (equivalent answers share a key); None: empty
    math_keys: frozenset[str]  # the classes read as math (the others are normalised text)
    response_answers: list[str | None]  # per response: the final answer read from it; None: unreadable
    response_keys: list[str | None]  # per response: the class it is equivalent to; None: none

    def checkable(self, key: str | None, response: int) -> bool:
        """Whether equivalence decides between the answer class `key` and response `response`."""
        return key is not None and key in self.math_keys and self.response_answers[response] is not None


class AnswerChecker(Protocol):
    async def compare(self, answers: Sequence[str | None], responses: Sequence[str]) -> Comparison: ...

    async def close(self) -> None: ...


def normalise(text: str) -> str:
    """Free text as a vote: spacing, case and closing punctuation do not count."""
    return " ".join(text.split()).rstrip(" .,:;!").casefold()


@lru_cache(maxsize=8192)
def _read(text: str) -> tuple[Any, ...]:
    """What math-verify reads in a text, kept: the judge's samples repeat one another ("13+4=17"
    five times), and a question's samples are read again against each response (1 ms a text)."""
    from math_verify import parse
    from text_to_num import alpha2digit

    plain = _TAG.sub(" ", text)
    parsed = parse(plain, parsing_timeout=_PARSE_TIMEOUT_S)
    if not parsed:  # no number in digits: perhaps one in words
        in_digits = _SIGN.sub("-", alpha2digit(_SCALE_COMMA.sub(r"\1", plain), "en"))
        if in_digits != plain:
            parsed = parse(in_digits, parsing_timeout=_PARSE_TIMEOUT_S)
    return tuple(parsed)


def compare_texts(answers: Sequence[str | None], responses: Sequence[str]) -> Comparison:
    """The comparison itself (runs in the worker process; callable directly where no deadline is needed)."""
    from math_verify import verify

    def read(text: str) -> list[Any]:
        return list(_read(text))

    def value(text: str) -> list[Any]:
        """What a judge's answer reads as when it is a value; [] (text) otherwise."""
        parsed = read(text)
        return parsed if parsed and is_value(parsed[0]) else []

    def same(gold: list[Any], target: list[Any]) -> bool:
        return bool(verify(gold, target, timeout_seconds=_PARSE_TIMEOUT_S))

    classes: list[tuple[str, list[Any]]] = []  # (key, parsed; [] for a text class)
    keys: list[str | None] = []
    for answer in answers:
        if answer is None or not normalise(answer):
            keys.append(None)
            continue
        parsed, text = value(answer), normalise(answer)
        # Math against math by the verifier; text against text by its normalised form.
        key = next((k for k, p in classes if same(p, parsed) if p and parsed), None) if parsed else None
        if not parsed:
            key = next((k for k, p in classes if not p and k == text), None)
        if key is None:
            key = shown(parsed) if parsed else text
            while any(k == key for k, _ in classes):  # a text class that reads like a math one
                key += "'"
            classes.append((key, parsed))
        keys.append(key)
    read_responses = [read(r) for r in responses]
    return Comparison(
        answer_keys=keys,
        math_keys=frozenset(k for k, p in classes if p),
        response_answers=[shown(p) if p else None for p in read_responses],
        # A response's answer that is not a value (an expression still to compute) matches nothing.
        response_keys=[
            next((k for k, p in classes if p and r and is_value(r[0]) and same(p, r)), None) for r in read_responses
        ],
    )


def shown(parsed: list[Any]) -> str:
    """How a read answer is shown: an integer as digits (1776, not "1,776" or "1776.0"), anything
    else as math-verify extracted it, less markdown and closing punctuation."""
    expr = parsed[0]
    if getattr(expr, "is_Integer", False):
        return str(expr)
    if getattr(expr, "is_Float", False) and expr.is_finite and float(expr).is_integer():
        return str(int(expr))
    return str(parsed[1]).strip("*_ .,;:")


def is_value(expr: Any) -> bool:
    """A number as written, not an expression still to compute: an integer, a decimal, or a
    fraction (or percentage) of integers; math-verify keeps "52*7" and "88-32" unevaluated."""
    if getattr(expr, "is_Number", False):
        return True
    if getattr(expr, "is_Mul", False) and len(expr.args) == 2:  # p/q, p% (p times 1/q)
        numerator, reciprocal = expr.args
        if type(reciprocal).__name__ == "UnevaluatedExpr":  # how math-verify writes the 1/100 of a percent
            reciprocal = reciprocal.args[0]
        if reciprocal.is_Pow:
            return bool(numerator.is_Integer and reciprocal.exp == -1 and reciprocal.base.is_Integer)
        return bool(numerator.is_Integer and reciprocal.is_Rational and reciprocal.p == 1)
    return False


def text_only(answers: Sequence[str | None], responses: Sequence[str]) -> Comparison:
    """When the verifier gave up: the judge's answers compared as text, no response checkable."""
    keys = [normalise(a) or None if a is not None else None for a in answers]
    return Comparison(keys, frozenset(), [None] * len(responses), [None] * len(responses))


class MathVerifyChecker:
    """compare_texts in a worker process, with a deadline per call; started on first use."""

    def __init__(self, deadline_s: float = _CALL_DEADLINE_S):
        self.deadline_s = deadline_s
        self._pool: Any = None
        self.timeouts = 0  # calls that ran past the deadline (their texts counted as unreadable)

    def pool(self) -> Any:
        """The worker pool (pebble's), started on first use."""
        if self._pool is None:
            from pebble import ProcessPool

            # spawn, not fork: the serving process runs threads (the model's), which fork would copy mid-lock.
            self._pool = ProcessPool(max_workers=1, context=multiprocessing.get_context("spawn"))
        return self._pool

    async def compare(self, answers: Sequence[str | None], responses: Sequence[str]) -> Comparison:
        future = self.pool().schedule(compare_texts, (list(answers), list(responses)), timeout=self.deadline_s)
        result = asyncio.wrap_future(future)
        result.add_done_callback(_retrieved)
        try:
            # A caller that leaves (its request's deadline, its client) leaves the comparison to run,
            # milliseconds, and its result is dropped. Cancelling it would stop the worker: pebble
            # stops the process of a cancelled task that a worker has taken, even one taken after
            # the cancel (noxdafox/pebble#144), and a task handed to a worker as it is stopped can
            # wait forever (#153, open). Under overload with short deadlines that left no request
            # answered at all (every try waited on the stuck worker past its deadline).
            return await asyncio.shield(result)
        except (FutureTimeout, ProcessExpired) as exc:  # past the deadline, or the worker died
            self.timeouts += 1
            log.warning("answer comparison failed (%r); the texts count as unreadable", exc)
            return text_only(answers, responses)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.stop()
            await asyncio.to_thread(pool.join)


def _retrieved(result: asyncio.Future) -> None:
    """A comparison whose caller left is not awaited: read its outcome so that asyncio does not
    report an exception nobody retrieved (a timeout, a dead worker) for it."""
    if not result.cancelled():
        result.exception()
