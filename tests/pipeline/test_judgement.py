"""From the judge's answers to a probability and a verdict (pure functions, no model)."""

import math

import pytest

from egrm.engines.base import Branch, FinishReason
from egrm.pipeline.judgement import by_equivalence, by_exact, by_verdicts, p_yes, share, weighted_vote
from egrm.pipeline.types import VerdictBy
from egrm.pipeline.verifier import Comparison


def comparison(response_key, response_answer="42", math=("42", "41")):
    return Comparison([], frozenset(math), [response_answer], [response_key])


def verdict(text, p):
    return Branch(text, [1], FinishReason.STOP, 10, 0, logprobs=[math.log(p)])


def test_weighted_vote_and_share():
    keys = ["42", "41", "42", None, "40"]
    assert weighted_vote(keys, [1, 1, 1, 1, 1]) == "42"
    assert weighted_vote(keys, [0.1, 0.9, 0.1, 5.0, 0.2]) == "41"  # an unreadable candidate has no say
    assert share(keys, [1, 1, 1, 1, 1], "42") == pytest.approx(0.5)
    assert share(keys, [1, 1, 1, 1, 1], None) == 0.0 and weighted_vote([None, None], [1, 1]) is None


def test_a_right_response_gets_the_share_of_samples_that_agree_with_it():
    keys = ["42", "42", "42", "42", "41"]
    j = by_equivalence(comparison("42"), keys, [1.0] * 5, "42")
    assert (j.p, j.right, j.by, j.judge_answer) == (pytest.approx(0.8), True, VerdictBy.EQUIVALENCE, "42")
    # The minority's answer is judged wrong, and its reward is the minority's share.
    j = by_equivalence(comparison("41", "41"), keys, [1.0] * 5, "42")
    assert (j.p, j.right) == (pytest.approx(0.2), False)
    # An answer no sample gave gets nothing.
    j = by_equivalence(comparison(None, "7"), keys, [1.0] * 5, "42")
    assert (j.p, j.right, j.response_answer) == (0.0, False, "7")


def test_equivalence_stands_aside_where_either_side_is_not_checkable():
    assert by_equivalence(comparison(None, None), ["42"], [1.0], "42") is None  # no number in the response
    assert by_equivalence(comparison(None, "7"), ["paris"], [1.0], "paris") is None  # free-text judge answer


def test_the_exact_estimate_gives_its_probability_when_the_response_matches():
    keys = ["42", "42", "41", "41", "41"]
    right = by_exact(comparison("42"), keys, "42", 0.7)
    assert (right.p, right.right) == (pytest.approx(0.7), True)
    # Otherwise the samples' share on the response, at most what the greedy answer leaves.
    wrong = by_exact(comparison("41", "41"), keys, "42", 0.7)
    assert (wrong.p, wrong.right) == (pytest.approx(0.3), False)


def test_yes_no_follow_ups_give_the_probability_of_yes():
    assert p_yes(verdict("Yes", 0.9)) == pytest.approx(0.9)
    assert p_yes(verdict("No", 0.9)) == pytest.approx(0.1)
    j = by_verdicts([verdict("Yes", 0.9), verdict("No", 0.8)], [3.0, 1.0], comparison(None, None), "paris")
    assert j.p == pytest.approx((3 * 0.9 + 0.2) / 4) and j.right and j.by is VerdictBy.JUDGE
