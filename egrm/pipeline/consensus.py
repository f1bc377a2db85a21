"""Votes, consensus and routing: the decision at the heart of E-GRM."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from egrm.pipeline.types import PathMode, Route


@dataclass(frozen=True, slots=True)
class Tally:
    votes: dict[str, int]  # answer -> count; unparseable samples are not votes
    majority: str | None  # the most frequent answer; ties go to the earliest (coolest) branch
    consensus: float  # count(majority) / M, M counting unparseable samples too


def tally(answers: Sequence[str | None]) -> Tally:
    if not answers:
        raise ValueError("cannot tally zero samples")
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return Tally({}, None, 0.0)
    # Counter keeps first-seen order, and max() returns the first of equal counts.
    majority = max(votes, key=lambda a: votes[a])
    return Tally(dict(votes), majority, votes[majority] / len(answers))


def choose_route(consensus: float, tau: float, path: PathMode) -> Route:
    """auto: short when the samples agree (consensus >= tau), long otherwise."""
    if path is PathMode.SHORT:
        return Route.SHORT
    if path is PathMode.LONG:
        return Route.LONG
    return Route.SHORT if consensus >= tau else Route.LONG
