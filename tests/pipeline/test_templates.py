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
    score = get_template("score").user_message(JudgeItem(prompt="Q?", response="R"))
    assert score.startswith("Question:\nQ?") and "Response:\nR" in score and "Reference" not in score


@pytest.mark.parametrize(
    ("text", "vote"),
    [
        ("2756", "2756"),
        (" 85. ", "85"),
        ("Paris.", "paris"),
        ("The  capital is\nParis", "the capital is paris"),
        ("", None),
    ],
)
def test_solve_first_votes_for_the_judges_own_answer(text, vote):
    assert get_template("verdict").vote(text) == vote


def test_the_followup_turn_shows_the_response_after_the_judges_answer():
    t = get_template("verdict")
    item = JudgeItem(prompt="What is 2+2?", response="5", reference="4")
    assert "5" not in t.user_message(item) and "Reference answer:\n4" in t.user_message(item)

    def chatml(messages):
        return "".join(f"<{m['role']}>{m['content']}</>" for m in messages) + "<assistant>"

    tail = t.followup_text(item, chatml)
    assert tail == "</><user>Response:\n5\n\nIs the response correct? Answer Yes or No.</><assistant>"
    with pytest.raises(ValueError, match="dropped"):
        t.followup_text(item, lambda messages: "nothing of it")


def test_choice_templates_vote_for_the_answer_alone():
    assert get_template("score").vote(" 7") == "7" and get_template("pairwise").vote("x") is None


def test_unknown_template():
    with pytest.raises(ValueError):
        get_template("essay")
