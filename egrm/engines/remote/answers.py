"""Constrained choice for runtimes that take a regular expression (SGLang `regex`, vLLM structured outputs)."""

from __future__ import annotations

import re
from collections.abc import Sequence


def answers_regex(allowed: Sequence[str]) -> str:
    """A pattern whose full matches are the allowed answers, bare or after one space.

    The same two forms the embedded engine's answer trie allows (constraint.py): right after the
    prompt a model may start its answer with a space. Runtimes match the whole output against it.
    Longest answers first, so a backtracking matcher never settles on a prefix ("1" of "10").
    """
    answers = sorted({a.strip() for a in allowed if a.strip()}, key=lambda a: (-len(a), a))
    if not answers:
        raise ValueError("allowed must hold at least one non-empty answer")
    return " ?(" + "|".join(re.escape(a) for a in answers) + ")"
