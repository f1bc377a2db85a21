"""Labelled judge data: the generated `builtin:arith` sets and users' own JSONL files.

`builtin:arith` asks whether a proposed answer to a small arithmetic question is right. Gold
verdicts are exact, difficulties are equal thirds (easy: 1-2 digit addition or subtraction;
medium: 2-digit times 1-digit; hard: 2-digit times 2-digit), and wrong answers are near misses
(off by one, off by ten, two adjacent digits swapped), so a judge cannot tell them by their look.
The splits are fixed: generated from fixed seeds, and no question of `test` appears in `train`.
`calibration` (for `egrm calibrate`) asks questions in neither, in every form `test` uses: the
judge was trained on `train` and is scored on `test`. Only 74 such medium questions are left, so
its medium third repeats them (with other proposed answers and wordings).
Its questions read "What is 52 * 53?" and its responses "The answer is 2756.".

`builtin:arith-mixed` is its sibling with the same difficulties and near misses, asked and
answered the way people write (`phrasing.py`): symbols, ×, words, word problems, "Compute …",
"… = ?"; bare numbers, sentences, equations, worked steps, "2,756", units, hedges, \boxed{}.
Its test split also holds question forms the train split never uses.

A user's file has one JSON object per line:
    {"id": "q1", "prompt": "...", "response": "...", "gold": "Yes"}
with optional "template" (verdict | score | pairwise; default verdict), "response_b" (pairwise),
"reference" and "difficulty" (any label; evaluation reports a breakdown by it).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from egrm.evals.phrasing import QUESTION_FORMS, RESPONSE_FORMS
from egrm.pipeline.templates import get_template
from egrm.pipeline.types import JudgeItem

BUILTIN_PREFIX = "builtin:"
DIFFICULTIES = ("easy", "medium", "hard")
SPLITS = {"train": (3600, 20261202), "test": (300, 7), "calibration": (900, 31)}  # name -> (size, seed)
MIXED_SEED_OFFSET = 1000  # builtin:arith-mixed draws other questions than builtin:arith
BUILTIN_SETS = ("arith", "arith-mixed")


@dataclass(frozen=True, slots=True)
class LabelledItem:
    id: str
    prompt: str
    response: str
    gold: str  # the canonical answer the template should give
    template: str = "verdict"
    difficulty: str = ""
    response_b: str | None = None
    reference: str | None = None
    truth: int | None = None  # builtin:arith: the question's exact result
    expression: str | None = None  # builtin:arith: the question as "52*53", however it is asked
    proposed: int | None = None  # builtin:arith: the number the response gives
    form: str = ""  # builtin:arith-mixed: "seen" or "unseen" question form, and the response form

    def judge_item(self) -> JudgeItem:
        return JudgeItem(self.prompt, self.response, self.response_b, self.reference, self.id)


@dataclass(frozen=True, slots=True)
class Question:
    a: int
    op: str
    b: int

    @property
    def value(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    def text(self) -> str:
        return f"What is {self.a} {self.op} {self.b}?"

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"


def _question(difficulty: str, rng: random.Random) -> Question:
    if difficulty == "easy":
        op = rng.choice("+-")
        a, b = rng.randint(2, 99), rng.randint(1, 99)
        if op == "-" and b > a:
            a, b = b, a
        return Question(a, op, b)
    if difficulty == "medium":
        return Question(rng.randint(12, 99), "*", rng.randint(2, 9))
    return Question(rng.randint(12, 99), "*", rng.randint(12, 99))


def near_miss(value: int, rng: random.Random) -> int:
    """A wrong answer that looks right: off by one or ten, or two adjacent digits swapped."""
    options = [value + 1, value - 1, value + 10, value - 10]
    digits = str(value)
    swaps = [
        int(digits[:i] + digits[i + 1] + digits[i] + digits[i + 2 :])
        for i in range(len(digits) - 1)
        if digits[i] != digits[i + 1] and not (i == 0 and digits[1] == "0")
    ]
    return rng.choice([o for o in options + swaps if o >= 0 and o != value])


Phrase = Callable[[Question, int, random.Random], tuple[str, str, str]]  # -> prompt, response, form


def plain(question: Question, proposed: int, rng: random.Random) -> tuple[str, str, str]:
    """builtin:arith's one phrasing."""
    return question.text(), f"The answer is {proposed}.", ""


def mixed(seen_only: bool) -> Phrase:
    """builtin:arith-mixed's phrasings: a question form and a response form drawn per item."""

    def phrase(question: Question, proposed: int, rng: random.Random) -> tuple[str, str, str]:
        forms = [f for f in QUESTION_FORMS[question.op] if f.seen or not seen_only]
        form = rng.choice(forms)
        written = rng.choice(RESPONSE_FORMS)
        prompt = form.render(question.a, question.b, rng, question.op)
        response = written.write(question.a, question.op, question.b, proposed, form.unit)
        return prompt, response, f"{'seen' if form.seen else 'unseen'}/{written.name}"

    return phrase


def generate_arith(
    n: int,
    seed: int,
    exclude: frozenset[Question] = frozenset(),
    unique: bool = True,
    phrase: Phrase = plain,
    prefix: str = "arith",
) -> list[LabelledItem]:
    """n items, equal thirds by difficulty, half of each third right, in a shuffled order.

    Never a question in `exclude`; with `unique`, no question twice (there are only 704
    medium questions, so a large training split repeats some, with other proposed answers).
    """
    rng = random.Random(seed)
    items: list[LabelledItem] = []
    seen = set(exclude)
    per = n // len(DIFFICULTIES)
    for difficulty in DIFFICULTIES:
        count = per + (1 if DIFFICULTIES.index(difficulty) < n % len(DIFFICULTIES) else 0)
        for k in range(count):
            q = _question(difficulty, rng)
            while q in seen:
                q = _question(difficulty, rng)
            if unique:
                seen.add(q)
            right = k % 2 == 0
            proposed = q.value if right else near_miss(q.value, rng)
            prompt, response, form = phrase(q, proposed, rng)
            items.append(
                LabelledItem(
                    id="",
                    prompt=prompt,
                    response=response,
                    gold="Yes" if right else "No",
                    difficulty=difficulty,
                    truth=q.value,
                    expression=q.expression,
                    proposed=proposed,
                    form=form,
                )
            )
    rng.shuffle(items)
    return [LabelledItem(**{**asdict(item), "id": f"{prefix}-{seed}-{i}"}) for i, item in enumerate(items)]


def question_of(item: LabelledItem) -> Question:
    """The question of a builtin:arith item: its expression ("52*53"), or (files written before
    items carried one) read back from the prompt ("What is 52 * 53?")."""
    if item.expression:
        a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)", item.expression).groups()  # type: ignore[union-attr]
    else:
        a, op, b = item.prompt.removeprefix("What is ").removesuffix("?").split(" ")
    return Question(int(a), op, int(b))


def _questions(items: list[LabelledItem]) -> frozenset[Question]:
    return frozenset(question_of(item) for item in items)


def builtin_arith(split: str, mixed_forms: bool = False) -> list[LabelledItem]:
    """`builtin:arith` (or, with mixed_forms, `builtin:arith-mixed`): a fixed split."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, not {split!r}")
    offset, prefix = (MIXED_SEED_OFFSET, "mixed") if mixed_forms else (0, "arith")
    size, seed = SPLITS["test"]
    phrase = mixed(seen_only=False) if mixed_forms else plain
    test = generate_arith(size, seed + offset, phrase=phrase, prefix=prefix)
    if split == "test":
        return test
    size, seed = SPLITS["train"]
    train = generate_arith(
        size,
        seed + offset,
        _questions(test),
        unique=False,
        phrase=mixed(seen_only=True) if mixed_forms else plain,
        prefix=prefix,
    )
    if split == "train":
        return train
    size, seed = SPLITS["calibration"]
    unseen = _questions(test) | _questions(train)
    return generate_arith(
        size,
        seed + offset,
        unseen,
        unique=False,
        phrase=mixed(seen_only=False) if mixed_forms else plain,
        prefix=prefix,
    )


def load_jsonl(path: Path) -> list[LabelledItem]:
    """A user's labelled set; a bad line raises ValueError naming the line and the field."""
    items = []
    fields = set(LabelledItem.__dataclass_fields__)
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: expected an object")
        for key in ("prompt", "response", "gold"):
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise ValueError(f"{where}: field {key!r} must be a non-empty string")
        unknown = set(raw) - fields
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
        raw.setdefault("id", f"line-{number}")
        item = LabelledItem(**raw)
        template = get_template(item.template)
        if item.gold not in template.answers:
            raise ValueError(f"{where}: field 'gold' must be one of {list(template.answers)} for {item.template}")
        if template.needs_response_b and not item.response_b:
            raise ValueError(f"{where}: field 'response_b' is required by the pairwise template")
        items.append(item)
    if not items:
        raise ValueError(f"{path}: no items")
    return items


def load_dataset(spec: str, split: str = "test") -> list[LabelledItem]:
    """`builtin:arith` (with a split) or a JSONL file."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTIN_SETS:
            available = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_SETS)
            raise ValueError(f"unknown built-in set {spec!r}; available: {available}")
        return builtin_arith(split, mixed_forms=name == "arith-mixed")
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--data {spec!r}: no such file")
    return load_jsonl(path)
