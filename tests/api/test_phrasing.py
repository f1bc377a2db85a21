"""The same answer written six ways gets the same verdict and the same reward, over real HTTP on the
real model: 20 held-out questions (easy, medium, hard), each with its right result and a near miss,
each written bare, as a sentence, as an equation, with a thousands separator and a unit, hedged
and boxed. One seed per request, so the judge draws the same samples for every form of a question.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from egrm.config import Settings
from egrm.evals.data import builtin_arith
from egrm.evals.phrasing import RESPONSE_FORMS
from egrm.main import create_app
from tests.live import serve

pytestmark = pytest.mark.slow

FORMS = [f for f in RESPONSE_FORMS if f.name in ("bare", "sentence", "equation", "units", "hedge", "boxed")]
# 20 questions whose held-out response is a near miss: each is written with its right result and its near miss.
QUESTIONS = [i for i in builtin_arith("test", mixed_forms=True) if i.gold == "No"][:20]


def operands(expression: str) -> tuple[int, str, int]:
    a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)", expression).groups()  # type: ignore[union-attr]
    return int(a), op, int(b)


def written(item, value: int) -> list[str]:
    a, op, b = operands(item.expression)
    return [form.write(a, op, b, value, "") for form in FORMS]


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serve(create_app(Settings(max_items=256), engine=engine)) as base:
        yield base


def verdicts(url: str, path: str, questions) -> list[tuple[list[dict], list[dict]]]:
    """Per question: the results for the six forms of its right result, and of its near miss."""
    items = []
    for q in questions:
        for value in (q.truth, q.proposed):
            items += [{"prompt": q.prompt, "response": text} for text in written(q, value)]
    body = {"items": items, "options": {"path": path, "seed": 5}}
    r = httpx.post(f"{url}/v1/rewards", json=body, timeout=900)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    n = len(FORMS)
    return [(results[k : k + n], results[k + n : k + 2 * n]) for k in range(0, len(results), 2 * n)]


def test_the_questions_cover_every_difficulty_and_six_forms():
    assert len(QUESTIONS) == 20 and len(FORMS) == 6
    assert {q.difficulty for q in QUESTIONS} == {"easy", "medium", "hard"}
    assert all(q.proposed != q.truth for q in QUESTIONS)


@pytest.mark.parametrize(("path", "count"), [("short", 20), ("long", 2)])
def test_six_ways_to_write_an_answer_get_one_verdict_and_one_reward(url, path, count):
    for q, (right, wrong) in zip(QUESTIONS, verdicts(url, path, QUESTIONS[:count]), strict=False):
        for forms in (right, wrong):
            assert {r["verdict_by"] for r in forms} == {"equivalence"}, (q.prompt, forms)
            assert len({(r["verdict"], r["reward"]) for r in forms}) == 1, (q.prompt, forms)
        # Two different numbers are two disjoint shares of the judge's probability.
        assert right[0]["reward"] + wrong[0]["reward"] <= 1.0 + 1e-9, (q.prompt, right, wrong)
