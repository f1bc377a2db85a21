"""builtin:arith is exact, balanced, fixed; user JSONL files are checked line by line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from egrm.evals.data import Question, builtin_arith, load_dataset, near_miss


def _question(prompt: str) -> Question:
    a, op, b = prompt.removeprefix("What is ").removesuffix("?").split(" ")
    return Question(int(a), op, int(b))


def test_gold_verdicts_are_exact() -> None:
    for item in builtin_arith("test"):
        q = _question(item.prompt)
        proposed = int(item.response.removeprefix("The answer is ").removesuffix("."))
        assert item.truth == q.value
        assert item.gold == ("Yes" if proposed == q.value else "No")


def test_test_split_is_balanced_and_fixed() -> None:
    test = builtin_arith("test")
    assert len(test) == 300
    assert Counter((i.difficulty, i.gold) for i in test) == {
        (d, g): 50 for d in ("easy", "medium", "hard") for g in ("Yes", "No")
    }
    assert [i.id for i in builtin_arith("test")] == [i.id for i in test]
    assert test == builtin_arith("test")


def test_train_never_holds_a_test_question() -> None:
    train, test = builtin_arith("train"), builtin_arith("test")
    assert len(train) == 3600
    assert not {_question(i.prompt) for i in train} & {_question(i.prompt) for i in test}


def test_near_misses_are_wrong_and_close() -> None:
    import random

    rng = random.Random(0)
    for value in (0, 9, 10, 100, 168, 2756, 9801):
        for _ in range(20):
            wrong = near_miss(value, rng)
            assert wrong != value and wrong >= 0
            assert abs(wrong - value) in (1, 10) or sorted(str(wrong)) == sorted(str(value))


def test_user_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    rows = [
        {"prompt": "2+2?", "response": "4", "gold": "Yes", "difficulty": "easy"},
        {"id": "p", "prompt": "Q", "response": "a", "response_b": "b", "gold": "B", "template": "pairwise"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = load_dataset(str(path))
    assert [i.id for i in items] == ["line-1", "p"]
    assert items[1].judge_item().response_b == "b"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "not JSON"),
        ('{"prompt": "q", "response": "r"}', "field 'gold'"),
        ('{"prompt": "q", "response": "r", "gold": "Maybe"}', "field 'gold' must be one of"),
        ('{"prompt": "q", "response": "r", "gold": "A", "template": "pairwise"}', "field 'response_b'"),
        ('{"prompt": "q", "response": "r", "gold": "Yes", "colour": 1}', "unknown field"),
    ],
)
def test_bad_lines_name_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message) as info:
        load_dataset(str(path))
    assert ":1:" in str(info.value) or str(path) in str(info.value)


def test_unknown_sources_are_refused() -> None:
    with pytest.raises(ValueError, match="builtin:arith"):
        load_dataset("builtin:nope")
    with pytest.raises(ValueError, match="no such file"):
        load_dataset("/nonexistent.jsonl")
    with pytest.raises(ValueError, match="split"):
        load_dataset("builtin:arith", split="dev")


def test_mixed_forms_set_is_balanced_fixed_and_its_answers_readable() -> None:
    from egrm.pipeline.verifier import compare_texts

    test = builtin_arith("test", mixed_forms=True)
    assert len(test) == 300 and test == builtin_arith("test", mixed_forms=True)
    assert Counter((i.difficulty, i.gold) for i in test) == {
        (d, g): 50 for d in ("easy", "medium", "hard") for g in ("Yes", "No")
    }
    # Many ways of asking and of answering; the response's number is what math-verify reads.
    assert len({i.form.split("/")[1] for i in test}) >= 8 and len({i.prompt.split()[0] for i in test}) >= 10
    for item in test:
        (read,) = compare_texts([str(item.truth)], [item.response]).response_answers
        assert (
            read is not None and float(read) == item.proposed and (item.proposed == item.truth) == (item.gold == "Yes")
        )


def test_mixed_train_split_shares_no_question_and_no_unseen_form_with_test() -> None:
    train, test = builtin_arith("train", mixed_forms=True), builtin_arith("test", mixed_forms=True)
    assert len(train) == 3600 and not {i.expression for i in train} & {i.expression for i in test}
    assert all(i.form.startswith("seen/") for i in train)
    assert 0.15 < sum(i.form.startswith("unseen/") for i in test) / len(test) < 0.4
    # Not builtin:arith again in other words: other questions.
    assert {i.expression for i in test} != {i.expression for i in builtin_arith("test")}


def test_load_dataset_names_the_builtin_sets() -> None:
    assert load_dataset("builtin:arith-mixed")[0].id.startswith("mixed-")
    with pytest.raises(ValueError, match="builtin:arith, builtin:arith-mixed"):
        load_dataset("builtin:nope")
