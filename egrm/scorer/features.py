"""What the trained scorer sees of a candidate: the signals the engine returns with every branch,
and what it reads in the reasoning's text.

The engine's signals are numbers the long path already has (log-probabilities, agreement,
length, whether the reasoning finished); the reading is whether the working's arithmetic steps
hold (egrm/scorer/reading.py), which any engine's text carries. No second model: scoring costs
microseconds. The ablation in docs/training.md ("Training the scorer") measures what each group adds.
"""

from __future__ import annotations

from egrm.pipeline.scorer import Candidate
from egrm.scorer.reading import steps

# name -> how to read it off a candidate
FEATURES: dict[str, str] = {
    "agreement": "share of the item's candidates with the same final answer",
    "mean_logprob": "mean log-prob of the reasoning and final-answer tokens",
    "min_logprob": "the least likely token of the reasoning (a slip shows up here)",
    "final_logprob": "log-prob of the final answer (the judge's own confidence in it)",
    "length": "reasoning tokens / 100",
    "finished": "1 if the reasoning reached the final-answer cue before the token limit",
    "answered": "1 if the final answer parsed",
    "slips": "share of the working's checked arithmetic steps that do not hold",
    "checked": "the working's checked arithmetic steps / 10 (0: nothing to read, slips says nothing)",
}
# The engine's confidence signals, each a one-signal baseline in evaluation.
ENGINE_SIGNALS = ("mean_logprob", "min_logprob", "final_logprob", "agreement", "length")


def vector(c: Candidate, names: tuple[str, ...] = tuple(FEATURES)) -> list[float]:
    read = steps(c.reasoning) if {"slips", "checked"} & set(names) else None
    values = {
        "agreement": c.agreement,
        "mean_logprob": c.mean_logprob,
        "min_logprob": c.min_logprob,
        "final_logprob": c.final_logprob,
        "length": c.tokens / 100,
        "finished": float(c.finished),
        "answered": float(c.answer is not None),
        "slips": read.slips if read else 0.0,
        "checked": read.checked / 10 if read else 0.0,
    }
    return [values[n] for n in names]
