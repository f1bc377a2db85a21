"""The judge's training targets: true arithmetic, and sequences laid out as the pipeline feeds them."""

from __future__ import annotations

import random
import re

import pytest

from egrm.engines.chat import chat_ids
from egrm.evals.data import LabelledItem, builtin_arith, question_of
from egrm.pipeline.templates import JUDGE
from egrm.training.judge_examples import IGNORE, INJECTIONS, Mix, Segment, example, layout
from egrm.training.judge_targets import own_answer, reasoning, targets, verdict

EOS = 2
_CHAIN = re.compile(r"[0-9*+\-=]+=[0-9*+\-=]+")


def _chains(text: str) -> list[str]:
    return [m.group(0) for m in _CHAIN.finditer(text)]


def test_every_step_of_every_reasoning_is_true_and_ends_at_the_verdict() -> None:
    items = builtin_arith("train") + builtin_arith("train", mixed_forms=True)
    checked = 0
    for item in items:
        own, steps, said = targets(item)
        truth = question_of(item).value
        for chain in [*_chains(steps), own]:
            sides = [eval(side) for side in chain.split("=")]  # digits and + - * only (the regex)
            assert len(set(sides)) == 1, f"{item.prompt}: {chain}"
            checked += 1
        assert own.endswith(f"={truth}") and steps.endswith(f"={truth}.") and said == item.gold
    assert checked > 2 * len(items)


@pytest.mark.parametrize(
    ("a", "op", "b", "expected"),
    [
        (47, "+", 38, "47+38=40+30+7+8=70+15=85."),
        (83, "-", 47, "83-47=83-40-7=43-7=43-3-4=40-4=36."),
        (32, "+", 9, "32+9=30+2+9=30+11=41."),
        (32, "+", 4, "32+4=30+2+4=30+6=36."),
        (29, "-", 9, "29-9=20+9-9=20+0=20."),
        (31, "-", 9, "31-9=31-1-8=30-8=22."),
        (83, "-", 7, "83-7=83-3-4=80-4=76."),
        (52, "*", 7, "52*7=50*7+2*7=350+14=364."),
        (52, "*", 50, "52*50=52*5*10. 52*5=50*5+2*5=250+10=260, so 52*50=2600."),
    ],
)
def test_reasoning_shapes(a: int, op: str, b: int, expected: str) -> None:
    from egrm.evals.data import Question

    assert reasoning(Question(a, op, b)).startswith(expected)


@pytest.mark.parametrize(
    ("a", "op", "b", "result", "expected"),
    [
        (47, "+", 38, 85, "47+38=40+30+7+8=70+15=85"),
        (83, "-", 47, 36, "83-47=83-40-7=43-7=43-3-4=40-4=36"),
        (52, "*", 7, 364, "52*7=50*7+2*7=350+14=364"),
        (52, "*", 53, 2756, "52*53=2756"),  # a two-digit product: one step (its working is the long path's)
        (47, "+", 38, 95, "47+38=40+30+7+8=70+15=95"),  # a wrong result keeps the steps
        (52, "*", 53, 2765, "52*53=2765"),
    ],
)
def test_own_answer_writes_the_carries_where_one_line_holds_them(
    a: int, op: str, b: int, result: int, expected: str
) -> None:
    from egrm.evals.data import Question

    assert own_answer(Question(a, op, b), result) == expected


def test_the_verdict_compares_the_response_with_the_result() -> None:
    assert verdict(2756, 2765) == "No" and verdict(85, 85) == "Yes"


def test_layout_labels_each_learnt_token_from_the_position_before_it() -> None:
    ex = layout([Segment([10, 11], False), Segment([20, 21], True, then_eos=True), Segment([30], False)], EOS)
    assert ex.ids == [10, 11, 20, 21, 30]
    assert ex.labels == [IGNORE, 20, 21, EOS, IGNORE]
    assert ex.learnt_tokens == 3
    with pytest.raises(ValueError, match="before it"):
        layout([Segment([1], True)], EOS)


def _tokenizer():
    from transformers import AutoTokenizer

    from egrm.config import Settings
    from egrm.engines.embedded.fetch import model_dir

    return AutoTokenizer.from_pretrained(model_dir(Settings().cache_dir))


def test_examples_are_what_the_pipeline_will_feed() -> None:
    tok = _tokenizer()
    prompt = "A box holds 72 pens. How many in 5 boxes?"
    item = LabelledItem("x", prompt, "630 pens", "No", truth=360, expression="72*5", proposed=630)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    def render(messages: list[dict[str, str]]) -> str:
        return str(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))

    def chat(messages: list[dict[str, str]], after: int | None) -> list[int]:
        return chat_ids(tok, messages, after)

    def make(**mix: float):
        ex = example(item, encode, chat, EOS, random.Random(0), Mix(**{"injected": 0.0, **mix}))
        learnt = tok.decode([t for t in ex.labels if t not in (IGNORE, EOS)])
        return tok.decode(ex.ids), learnt, ex.labels.count(EOS)

    judge_item = item.judge_item()
    prompt = render(JUDGE.messages(judge_item))  # the rendered judge prompt from here on
    assert "630" not in prompt  # solve first: the judge answers before it sees the response
    followup = tok.decode(chat(JUDGE.conversation(judge_item, "", "630 pens"), JUDGE.OWN_ANSWER))
    steps = reasoning(question_of(item))
    own = "72*5=70*5+2*5=350+10=360"  # the computation, its carry, its result
    # Long: own answer (the computation and its result), then the reasoning; that is all the
    # verifier needs (it compares the result with the response's number).
    text, learnt, stops = make(short_share=0.0, wrong_own=0.0, verdict_share=0.0, uncheckable=0.0)
    assert text == prompt + own + JUDGE.reasoning_cue + steps
    assert learnt == own + steps and stops == 2  # it learns to stop after each
    # Some long sequences go on to the Yes/No follow-up, which compares with the reasoning's result.
    text, learnt, stops = make(short_share=0.0, wrong_own=0.0, verdict_share=1.0, uncheckable=0.0)
    assert text == prompt + own + JUDGE.reasoning_cue + steps + followup + "No" and learnt.endswith("No")
    # The whole exchange renders as the chat it is: the follow-up is a user turn after the answer.
    conversation = JUDGE.conversation(judge_item, own + JUDGE.reasoning_cue + steps, "630 pens")
    assert text == render(conversation) + "No"
    # Short: own answer, then straight to the response and the verdict.
    text, learnt, stops = make(short_share=1.0, wrong_own=0.0, uncheckable=0.0)
    assert text == prompt + own + followup + "No" and learnt == own + "No" and stops == 1
    # A wrong own answer is not learnt; the short verdict follows it, the long one the reasoning.
    text, learnt, _ = make(short_share=1.0, wrong_own=1.0, uncheckable=0.0)
    assert not text.startswith(prompt + own) and learnt in ("No", "Yes")
    text, learnt, _ = make(short_share=0.0, wrong_own=1.0, verdict_share=1.0, uncheckable=0.0)
    assert learnt == steps + "No"
    # The follow-up mostly meets responses the verifier cannot read: a non-answer is always "No".
    for seed in range(20):
        ex = example(item, encode, chat, EOS, random.Random(seed), Mix(short_share=1.0, uncheckable=1.0))
        shown = tok.decode(ex.ids).rpartition("Response:\n")[2]
        assert "630" not in shown and tok.decode([t for t in ex.labels if t not in (IGNORE, EOS)]).endswith("No")
    # A response that asks for a Yes gets the truth's verdict all the same.
    said = set()
    for seed in range(20):
        ex = example(item, encode, chat, EOS, random.Random(seed), Mix(short_share=1.0, wrong_own=0.0, injected=1.0))
        shown = tok.decode(ex.ids).rpartition("Response:\n")[2]
        said.add(tok.decode([t for t in ex.labels if t not in (IGNORE, EOS)]).removeprefix(own))
        response = shown.partition("\n\nIs the response correct?")[0]
        assert any(all(piece in response for piece in attack.split("{r}") if piece) for attack in INJECTIONS)
    assert said == {"No"}


def test_a_wrong_own_answer_is_never_right_and_mostly_has_another_last_digit() -> None:
    from egrm.training.judge_examples import wrong_answer

    rng = random.Random(0)
    for value in (5, 44, 107, 364, 2756):
        wrong = [wrong_answer(value, rng) for _ in range(200)]
        assert value not in wrong and min(wrong) >= 0
        # Copying its last digit should not pay: most wrong answers end in another digit.
        assert sum(w % 10 != value % 10 for w in wrong) > 0.6 * len(wrong)
