"""Labelled judge data: the generated `builtin:arith` set and users' own JSONL files.

`builtin:arith` asks whether a proposed answer to a small arithmetic question is right. Gold
verdicts are exact, difficulties are equal thirds (easy: 1-2 digit addition or subtraction;
medium: 2-digit times 1-digit; hard: 2-digit times 2-digit), and wrong answers are near misses
(off by one, off by ten, two adjacent digits swapped), so a judge cannot tell them by their look.
The splits are fixed: generated from fixed seeds, and no question of `test` appears in `train`.

A user's file has one JSON object per line:
    {"id": "q1", "prompt": "...", "response": "...", "gold": "Yes"}
with optional "template" (verdict | score | pairwise; default verdict), "response_b" (pairwise),
"reference" and "difficulty" (any label; evaluation reports a breakdown by it).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from app.pipeline.templates import get_template
from app.pipeline.types import JudgeItem

BUILTIN_PREFIX = "builtin:"
DIFFICULTIES = ("easy", "medium", "hard")
SPLITS = {"train": (3600, 20261202), "test": (300, 7)}  # name -> (size, seed)


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


def generate_arith(
    n: int, seed: int, exclude: frozenset[Question] = frozenset(), unique: bool = True
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
            items.append(
                LabelledItem(
                    id="",
                    prompt=q.text(),
                    response=f"The answer is {proposed}.",
                    gold="Yes" if right else "No",
                    difficulty=difficulty,
                    truth=q.value,
                )
            )
    rng.shuffle(items)
    prefix = f"arith-{seed}-"
    return [LabelledItem(**{**asdict(item), "id": f"{prefix}{i}"}) for i, item in enumerate(items)]


def question_of(item: LabelledItem) -> Question:
    """The question of a builtin:arith item, read back from its prompt ("What is 52 * 53?")."""
    a, op, b = item.prompt.removeprefix("What is ").removesuffix("?").split(" ")
    return Question(int(a), op, int(b))


def _questions(items: list[LabelledItem]) -> frozenset[Question]:
    return frozenset(question_of(item) for item in items)


def builtin_arith(split: str) -> list[LabelledItem]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, not {split!r}")
    size, seed = SPLITS["test"]
    test = generate_arith(size, seed)
    if split == "test":
        return test
    size, seed = SPLITS["train"]
    return generate_arith(size, seed, exclude=_questions(test), unique=False)


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
        if name != "arith":
            raise ValueError(f"unknown built-in set {spec!r}; available: builtin:arith")
        return builtin_arith(split)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"--data {spec!r}: no such file")
    return load_jsonl(path)
