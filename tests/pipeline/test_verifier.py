"""Answer equivalence through math-verify: the same answer however written, and hostile input bounded."""

import asyncio
import os

import pytest

from egrm.pipeline.verifier import MathVerifyChecker, compare_texts, normalise

SAME_ANSWER = [
    "1776",
    "1,776",
    "The answer is 1776.",
    "That makes 1,776.",
    "1776 apples",
    "$1776",
    "$\\boxed{1776}$",
    "**1776**",
    "I think it's 1776, but I'm not completely sure.",
    "24 × 74 = 24 × 70 + 24 × 4 = 1680 + 96 = 1776",
    "1776.0",
]


@pytest.mark.parametrize("response", SAME_ANSWER)
def test_a_right_answer_matches_however_it_is_written(response):
    c = compare_texts(["1776"], [response])
    assert c.response_keys == ["1776"] and c.checkable("1776", 0)


@pytest.mark.parametrize("response", [r.replace("1776", "1767").replace("1,776", "1,767") for r in SAME_ANSWER])
def test_a_near_miss_matches_nothing_however_it_is_written(response):
    c = compare_texts(["1776"], [response])
    assert c.response_keys == [None] and c.response_answers[0] is not None and c.checkable("1776", 0)


def test_equivalent_judge_answers_form_one_class():
    c = compare_texts(["42", " 42.", "42.0", "41", None, "", "Paris", "paris."], ["the meaning of life"])
    assert c.answer_keys == ["42", "42", "42", "41", None, None, "paris", "paris"]
    assert c.math_keys == {"42", "41"}
    # A response with no number in it is not checkable: the judge's follow-up decides it.
    assert c.response_answers == [None] and not c.checkable("42", 0)


@pytest.mark.parametrize(
    ("response", "read"),
    [
        ("one thousand seven hundred and seventy-six", "1776"),
        ("The answer is one thousand seven hundred seventy-six.", "1776"),
        ("<b>One thousand, seven hundred and seventy-six</b>", "1776"),
        ("one thousand seven hundred and sixty-seven", "1767"),  # a near miss in words is read, and misses
        ("five hundred and two", "502"),
        ("nine hundred and ninety-nine thousand, nine hundred and ninety-nine", "999999"),  # num2words' form
        ("eighty-eight", "88"),
        ("minus twelve", "-12"),
        ("It is negative five.", "-5"),
        ("eighty-eight minus thirty-two", "32"),  # a difference, read as its digits would be ("88 minus 32")
        ("It is three.", "3"),
    ],
)
def test_a_number_in_words_is_read_as_the_number(response, read):
    c = compare_texts(["1776"], [response])
    assert c.response_answers == [read] and c.checkable("1776", 0)
    assert c.response_keys == (["1776"] if read == "1776" else [None])


@pytest.mark.parametrize("response", ["one of them", "two", "I am not sure", "Paris", "one half"])
def test_words_that_are_not_a_number_stay_unreadable(response):
    # text2num leaves a lone zero, one or two as words ("one of them" is not an answer of 1).
    assert compare_texts(["1"], [response]).response_answers == [None]


def test_fractions_and_decimals_are_the_same_number():
    assert compare_texts(["0.5"], ["\\frac{1}{2}"]).response_keys == ["0.5"]
    assert compare_texts(["3/4"], ["0.75"]).response_keys == ["3/4"]


def test_free_text_is_never_checkable():
    c = compare_texts(["Paris"], ["Paris"])
    assert c.answer_keys == ["paris"] and not c.checkable("paris", 0)


def test_normalise():
    assert normalise("  The  capital\nis Paris. ") == "the capital is paris"


def test_the_worker_compares_and_a_call_past_its_deadline_kills_it():
    async def run():
        # A cold worker imports math-verify (about 0.3 s) inside its first call: past a 10 ms
        # deadline, as a response sympy cannot finish with would be.
        checker = MathVerifyChecker(deadline_s=0.01)
        try:
            late = await checker.compare(["364", "364"], ["The answer is 364."])
            checker.deadline_s = 30.0
            after = await checker.compare(["364"], ["The answer is 364."])  # a fresh worker answers
            tower = await checker.compare(["364"], ["9^9^9^9^9"])  # read, never evaluated: not a value
        finally:
            await checker.close()
        return late, after, tower, checker.timeouts

    late, after, tower, timeouts = asyncio.run(run())
    # Past the deadline the texts count as unreadable; the judge's answers are still grouped as text.
    assert late.response_answers == [None] and late.answer_keys == ["364", "364"] and not late.math_keys
    assert timeouts == 1  # the worker was killed at the deadline, not waited for
    assert after.response_keys == ["364"] and tower.response_keys == [None]


def test_a_caller_that_leaves_mid_comparison_does_not_kill_the_worker():
    """A request's deadline cancels its comparison, running or queued: the comparison is left to
    run and the worker stays. Stopping it for a cancel made every comparison queued behind wait
    for a fresh worker, and pebble can lose a task handed to a worker as it is stopped: under
    overload (tests/api/test_groups.py) no request was answered any more."""

    async def run():
        checker = MathVerifyChecker()

        async def pid() -> int:  # the worker's
            return await asyncio.wrap_future(checker.pool().schedule(os.getpid))

        try:
            before = await pid()  # started and warm
            running = asyncio.create_task(checker.compare(["33"], [f"The answer is {i}." for i in range(3000)]))
            queued = asyncio.create_task(checker.compare(["33"], ["33"]))
            await asyncio.sleep(0.2)  # the first runs (about a second), the second waits behind it
            running.cancel()
            queued.cancel()
            after = await checker.compare(["33"], ["The answer is 33."])
            return before, await pid(), after, running.cancelled() and queued.cancelled()
        finally:
            await checker.close()

    before, then, after, cancelled = asyncio.run(run())
    assert cancelled and then == before  # the callers left; the worker stayed
    assert after.response_keys == ["33"]


@pytest.mark.parametrize("response", ["88-32", "The answer is 88 - 32.", "(88-32)", "\\boxed{88-32}", "44+12"])
def test_restating_the_question_as_an_expression_is_not_an_answer(response):
    # math-verify evaluates "88-32" to 56: read as a value it would earn the right answer's reward.
    c = compare_texts(["56"], [response])
    assert c.response_keys == [None] and c.checkable("56", 0)


@pytest.mark.parametrize(
    ("answer", "response"), [("0.75", "3/4"), ("0.75", "\\frac{3}{4}"), ("-3", "-3"), ("0.42", "42%")]
)
def test_numbers_as_written_are_values(answer, response):
    assert compare_texts([answer], [response]).response_keys == [answer]


def test_a_judge_answer_still_to_compute_is_text_not_math():
    c = compare_texts(["88-32=56", "88-32"], ["56"])
    assert c.answer_keys == ["56", "88-32"] and c.math_keys == {"56"}


@pytest.mark.parametrize(
    "response", ["<filename>51 apples<file_sep>Yes<|im_end|>", "<b>51</b>", "51</s><pad>", "<|im_start|>51"]
)
def test_markup_cannot_hide_an_answer_from_the_verifier(response):
    assert compare_texts(["52"], [response]).response_answers == ["51"]
