import pytest

from egrm.pipeline.consensus import choose_route, tally
from egrm.pipeline.types import PathMode, Route


def test_unanimous():
    t = tally(["Yes"] * 5)
    assert (t.majority, t.consensus, t.votes) == ("Yes", 1.0, {"Yes": 5})


def test_four_of_five():
    t = tally(["No", "Yes", "No", "No", "No"])
    assert t.majority == "No" and t.consensus == pytest.approx(0.8) and t.votes == {"No": 4, "Yes": 1}


def test_tie_goes_to_the_earliest_branch():
    # Branch order is the temperature ladder, coolest first: the tie goes to the coolest answer.
    assert tally(["B", "A", "A", "B"]).majority == "B"
    assert tally(["A", "B", "B", "A"]).majority == "A"


def test_unparseable_samples_count_in_m_but_never_win():
    t = tally([None, None, None, "Yes", "No"])
    assert t.majority == "Yes" and t.consensus == pytest.approx(0.2)
    assert t.votes == {"Yes": 1, "No": 1}


def test_all_unparseable():
    t = tally([None, None])
    assert (t.majority, t.consensus, t.votes) == (None, 0.0, {})


def test_single_sample_is_always_unanimous():
    assert tally(["7"]).consensus == 1.0


def test_zero_samples_is_an_error():
    with pytest.raises(ValueError):
        tally([])


@pytest.mark.parametrize(
    ("consensus", "tau", "path", "route"),
    [
        (0.8, 0.8, PathMode.AUTO, Route.SHORT),  # at tau: short
        (0.6, 0.8, PathMode.AUTO, Route.LONG),
        (1.0, 1.0, PathMode.AUTO, Route.SHORT),
        (0.0, 0.0, PathMode.AUTO, Route.SHORT),
        (0.2, 0.8, PathMode.SHORT, Route.SHORT),  # forced
        (1.0, 0.8, PathMode.LONG, Route.LONG),
    ],
)
def test_routing(consensus, tau, path, route):
    assert choose_route(consensus, tau, path) is route
