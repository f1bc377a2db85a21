"""The scorer's reading of a candidate's working: which arithmetic steps hold."""

from __future__ import annotations

from fractions import Fraction

import pytest

from egrm.scorer.reading import Steps, steps, value


@pytest.mark.parametrize(
    ("segment", "expected"),
    [
        ("83-40-7", Fraction(36)),
        (" 2,756 ", Fraction(2756)),
        ("(2+3)×4", Fraction(20)),
        ("7·8", Fraction(56)),
        ("3/4", Fraction(3, 4)),
        ("-5+2", Fraction(-3)),
        ("12.", Fraction(12)),
    ],
)
def test_plain_arithmetic_is_evaluated_exactly(segment, expected):
    assert value(segment) == expected


@pytest.mark.parametrize("segment", ["so the answer", "2**100", "9" * 200, "x", "", "1/0", "()", "four"])
def test_anything_else_is_not_a_step(segment):
    assert value(segment) is None


def test_a_slip_in_the_working_is_read_and_the_judges_own_answer_is_not():
    right = "83-47=36\nLet me check step by step.\n83-47=83-40-7=43-7=43-3-4=40-4=36."
    slipped = "83-47=36\nLet me check step by step.\n83-47=83-40-7=43-7=46."
    assert steps(right) == Steps(checked=5, wrong=0) and steps(right).slips == 0.0
    assert steps(slipped) == Steps(checked=3, wrong=1) and steps(slipped).slips == pytest.approx(1 / 3)
    wrong_own = "83-47=46\nLet me check step by step.\n83-47=83-40-7=43-7=36."  # a wrong own answer, then right
    assert steps(wrong_own).wrong == 0


def test_steps_in_sentences_are_split_at_their_clauses():
    working = "x\n55*88=55*80+55*8. 55*8=400+40=440, so 55*80=4400. 4400+440=4740."
    assert steps(working) == Steps(checked=5, wrong=1)  # only the last addition slipped


def test_text_without_arithmetic_gives_nothing_to_read():
    assert steps("Yes\nThe capital of France is Paris.") == Steps(0, 0) and Steps(0, 0).slips == 0.0
