"""Which path an item takes: the method's threshold on the vote, or a policy calibrated per judge.

The method routes short when the M samples agree (consensus >= tau). A small judge agrees with
itself on some wrong answers too (the short path's errors are unanimous slips), so a policy can
ask for more before it trusts the vote: the greedy short answer's own probability (`exact`, one
more branch in the same batch), that answer being the vote's, and, when the first M samples are
borderline, more samples from the same cached prompt (adaptive M) whose agreement decides.
`egrm calibrate` chooses a policy on labelled items (calibration.py); the service loads it and
says so, and routes on tau when there is none.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Signals:
    """What the engine tells of the judge's confidence in its own short answer."""

    consensus: float  # the first M samples' vote share
    exact: float | None = None  # the greedy short answer's probability (T=1), when the greedy branch ran
    agrees: bool | None = None  # the greedy answer is the vote's majority
    consensus_all: float | None = None  # over the first M and the extra samples, when extra were drawn


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    """Short when every condition that is set holds; extra samples when the vote is borderline."""

    name: str
    min_consensus: float  # the first M samples' vote share, at least
    min_exact: float | None = None  # the greedy answer's probability, at least
    require_agree: bool = False  # the greedy answer must be the vote's
    extra: int = 0  # samples drawn more when min_consensus <= consensus < borderline
    borderline: float = 1.0
    min_consensus_all: float | None = None  # then, over all samples, at least
    calibration: dict[str, Any] = field(default_factory=dict, compare=False)  # where it came from

    def __post_init__(self) -> None:
        if self.extra < 0 or (self.extra and self.min_consensus_all is None):
            raise ValueError(f"policy {self.name!r}: extra samples need min_consensus_all (and extra >= 0)")

    @property
    def needs_exact(self) -> bool:
        return self.min_exact is not None or self.require_agree

    def wants_extra(self, consensus: float) -> bool:
        """Whether the first M samples are borderline: more are drawn before deciding."""
        return self.extra > 0 and self.min_consensus <= consensus < self.borderline

    def short(self, s: Signals) -> bool:
        if s.consensus < self.min_consensus:
            return False
        if self.min_exact is not None and (s.exact is None or s.exact < self.min_exact):
            return False
        if self.require_agree and not s.agrees:
            return False
        if self.wants_extra(s.consensus):
            assert self.min_consensus_all is not None  # checked at construction
            return s.consensus_all is not None and s.consensus_all >= self.min_consensus_all
        return True

    @property
    def key(self) -> tuple[Any, ...]:
        """What decides the routing (for the question's key: another policy is other work)."""
        return (
            self.min_consensus,
            self.min_exact,
            self.require_agree,
            self.extra,
            self.borderline,
            self.min_consensus_all,
        )

    def describe(self) -> str:
        parts = [f"consensus >= {self.min_consensus:g}"]
        if self.min_exact is not None:
            parts.append(f"exact >= {self.min_exact:g}")
        if self.require_agree:
            parts.append("greedy agrees")
        if self.extra:
            parts.append(f"below {self.borderline:g}: {self.extra} more samples, then >= {self.min_consensus_all:g}")
        return f"{self.name}: " + ", ".join(parts)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> RoutingPolicy:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: not a routing policy ({exc})") from exc


def describe_routing(policy: RoutingPolicy | None, tau: float) -> str:
    """What routes the auto path, in words (the responses and the evaluation report say it)."""
    return policy.describe() if policy is not None else f"tau={tau:g}"


def threshold(tau: float) -> RoutingPolicy:
    """The method's routing: the vote alone, at tau."""
    return RoutingPolicy(name=f"tau={tau:g}", min_consensus=tau)
