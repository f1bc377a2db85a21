"""Right-against-wrong pairs for `egrm eval --template pairwise`: same text, other number."""

import random

from egrm.evals.data import builtin_arith
from egrm.evals.pairwise import right_and_wrong, swapped_number
from egrm.pipeline.verifier import compare_texts


def test_swapped_number_keeps_the_wording():
    assert swapped_number("That makes 1,776.", 1776, 1767) == "That makes 1,767."
    assert swapped_number("**364**", 364, 365) == "**365**"


def test_each_item_gives_a_right_and_a_wrong_response_that_differ_only_in_the_answer():
    rng = random.Random(0)
    for item in builtin_arith("test", mixed_forms=True)[:60]:
        right, wrong = right_and_wrong(item, rng)
        (r, w) = compare_texts([str(item.truth)], [right, wrong]).response_keys
        assert r == str(item.truth) and w is None
        assert item.response in (right, wrong)
