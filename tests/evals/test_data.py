"""builtin:arith is exact, balanced, fixed; user JSONL files are checked line by line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from app.evals.data import Question, builtin_arith, load_dataset, near_miss


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
