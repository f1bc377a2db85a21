import pytest

from app.pipeline.templates import get_template
from app.pipeline.types import JudgeItem


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Yes", "Yes"),
        (" yes.", "Yes"),
        ("NO", "No"),
        ("No, because 2+2=4", "No"),
        ("Yesterday", None),
        ("I cannot tell", None),
        ("", None),
    ],
)
def test_verdict_extraction(text, answer):
    assert get_template("verdict").extract(text) == answer


@pytest.mark.parametrize(
    ("text", "answer"),
    [("10", "10"), (" 7", "7"), ("7/10", "7"), ("Score: 1", "1"), ("0", None), ("11", None), ("none", None)],
)
def test_score_extraction(text, answer):
    assert get_template("score").extract(text) == answer


@pytest.mark.parametrize(("text", "answer"), [("A", "A"), (" B.", "B"), ("a", None), ("ABC", None)])
def test_pairwise_extraction(text, answer):
    assert get_template("pairwise").extract(text) == answer


@pytest.mark.parametrize(
    ("template", "answer", "reward"),
    [
        ("verdict", "Yes", 1.0),
        ("verdict", "No", 0.0),
        ("score", "1", 0.0),
        ("score", "10", 1.0),
        ("score", "5", 4 / 9),
        ("pairwise", "A", 1.0),
        ("pairwise", "B", 0.0),
    ],
)
def test_reward_mapping(template, answer, reward):
    assert get_template(template).reward(answer) == pytest.approx(reward)


def test_every_allowed_answer_extracts_to_itself():
    for name in ("verdict", "score", "pairwise"):
        t = get_template(name)
        assert [t.extract(a) for a in t.answers] == list(t.answers)


def test_user_message_carries_everything_the_judge_needs():
    item = JudgeItem(prompt="What is 2+2?", response="4", response_b="5", reference="4")
    pairwise = get_template("pairwise").user_message(item)
    assert "Response A:\n4" in pairwise and "Response B:\n5" in pairwise and "Reference answer:\n4" in pairwise
    verdict = get_template("verdict").user_message(JudgeItem(prompt="Q?", response="R"))
    assert verdict.startswith("Question:\nQ?") and "Reference" not in verdict and verdict.endswith("Yes or No.")


def test_unknown_template():
    with pytest.raises(ValueError):
        get_template("essay")
