"""What the trained scorer sees of a candidate: signals the engine returns with every branch.

No text model: these are numbers the long path already has (log-probabilities, agreement,
length, whether the reasoning finished), so scoring costs microseconds and needs no second
model. The ablation in README ("Scorer") measures what each group adds.
"""

from __future__ import annotations

from app.scorer.base import Candidate

# name -> how to read it off a candidate
FEATURES: dict[str, str] = {
    "agreement": "share of the item's candidates with the same final answer",
    "mean_logprob": "mean log-prob of the reasoning and final-answer tokens",
    "min_logprob": "the least likely token of the reasoning (a slip shows up here)",
    "final_logprob": "log-prob of the final answer (the judge's own confidence in it)",
    "length": "reasoning tokens / 100",
    "finished": "1 if the reasoning reached the final-answer cue before the token limit",
    "answered": "1 if the final answer parsed",
}


def vector(c: Candidate, names: tuple[str, ...] = tuple(FEATURES)) -> list[float]:
    values = {
        "agreement": c.agreement,
        "mean_logprob": c.mean_logprob,
        "min_logprob": c.min_logprob,
        "final_logprob": c.final_logprob,
        "length": c.tokens / 100,
        "finished": float(c.finished),
        "answered": float(c.answer is not None),
    }
    return [values[n] for n in names]
