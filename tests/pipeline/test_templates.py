import pytest

from egrm.pipeline.templates import JUDGE, get_template
from egrm.pipeline.types import JudgeItem


@pytest.mark.parametrize(
    ("template", "p", "right", "answer", "reward"),
    [
        ("verdict", [0.8], [True], "Yes", 0.8),
        ("verdict", [0.2], [False], "No", 0.2),
        ("score", [0.0], [False], "1", 0.0),
        ("score", [1.0], [True], "10", 1.0),
        ("score", [0.5], [True], "6", 0.5),
        ("pairwise", [1.0, 0.0], [True, False], "A", 1.0),
        ("pairwise", [0.0, 1.0], [False, True], "B", 0.0),
        ("pairwise", [0.6, 0.6], [True, True], "tie", 0.5),
        ("pairwise", [0.8, 0.2], [True, False], "A", 0.8),
    ],
)
def test_every_template_presents_the_same_judgement(template, p, right, answer, reward):
    assert get_template(template).present(p, right) == (answer, pytest.approx(reward))


def test_score_rises_with_the_probability_and_spans_the_scale():
    scores = [int(get_template("score").present([p / 20], [p >= 10])[0]) for p in range(21)]
    assert scores == sorted(scores) and scores[0] == 1 and scores[-1] == 10


def test_pairwise_is_symmetric_in_its_responses():
    pairwise = get_template("pairwise")
    for pa, pb in [(0.9, 0.1), (0.3, 0.7), (0.5, 0.5)]:
        (a, ra), (b, rb) = pairwise.present([pa, pb], [True, True]), pairwise.present([pb, pa], [True, True])
        assert ra == pytest.approx(1 - rb) and {a, b} <= {"A", "B", "tie"} and (a == "tie") == (b == "tie")


def test_the_judge_is_shown_the_question_alone_first():
    item = JudgeItem(prompt="What is 2+2?", response="5", response_b="6", reference="4")
    user = JUDGE.messages(item)[1]["content"]
    assert user.startswith("Question:\nWhat is 2+2?") and "Reference answer:\n4" in user
    assert "5" not in user and "6" not in user


def test_the_followup_turn_shows_the_response_after_the_judges_answer():
    item = JudgeItem(prompt="What is 2+2?", response="5", reference="4")
    conversation = JUDGE.conversation(item, "2+2=4", "5")
    assert conversation[: JUDGE.OWN_ANSWER] == JUDGE.messages(item)
    assert conversation[JUDGE.OWN_ANSWER] == {"role": "assistant", "content": "2+2=4"}
    assert conversation[-1] == {"role": "user", "content": "Response:\n5\n\nIs the response correct? Answer Yes or No."}


@pytest.mark.parametrize(("text", "verdict"), [("Yes", "Yes"), (" no", "No"), ("NO", "No"), ("Yesterday", None)])
def test_a_constrained_verdict_reads_back(text, verdict):
    assert JUDGE.verdict_of(text) == verdict


def test_unknown_template():
    with pytest.raises(ValueError):
        get_template("essay")


@pytest.mark.parametrize(
    ("text", "verdict"), [("Yes, it is right.", "Yes"), ("The answer: no.", "No"), ("Maybe", None)]
)
def test_an_unconstrained_verdict_is_its_first_yes_or_no(text, verdict):
    assert JUDGE.verdict_of(text) == verdict
