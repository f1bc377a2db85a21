"""The files under examples/ that README.md and docs/ name ship, and read as what they are for."""

from __future__ import annotations

import re
from pathlib import Path

from egrm.batch import read_todo
from egrm.evals.data import load_dataset

ROOT = Path(__file__).resolve().parents[1]
# A path of ours: not inside a URL, and not the text of a link to another project's file
# (veRL's `examples/data_preprocess/gsm8k.py` is linked to veRL's repository).
_OURS = re.compile(r"(?<![\w/.-])examples/[\w./-]*\w(?![\w./-])(?!`\]\(http)")


def named_in_readme() -> set[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {name for page in pages for name in _OURS.findall(page.read_text())}


def test_every_example_the_readme_names_exists():
    named = named_in_readme()
    assert {"examples/score.jsonl", "examples/eval.jsonl"} <= named
    assert sorted(path for path in named if not (ROOT / path).is_file()) == []


def test_the_scoring_example_has_no_bad_line():
    todo = read_todo(ROOT / "examples/score.jsonl", set())
    assert todo.bad == [] and len(todo.items) == 4


def test_the_eval_example_loads_with_its_labels():
    items = load_dataset(str(ROOT / "examples/eval.jsonl"))
    assert [item.gold for item in items] == ["Yes", "No", "Yes", "No"]
