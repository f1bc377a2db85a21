"""Wire models only: what crosses HTTP, validated by pydantic.

Imported by the client side too (egrm.client, the veRL reward function), so it imports nothing
but pydantic: a training environment installs it without torch (`pip install egrm`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

TemplateLiteral = Literal["verdict", "score", "pairwise"]
MAX_M = 16  # most samples per item (EGRM_M's bound too)


def unicode_text(text: str) -> str:
    """JSON may escape a lone surrogate (\\ud800), which no tokenizer can encode: a 422, on every route."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"not valid Unicode text (a lone surrogate at character {exc.start})") from None
    return text


# User text that reaches the judge: every route's wire models take it as this type.
Text = Annotated[str, AfterValidator(unicode_text)]


class ErrorDetail(BaseModel):
    type: str
    message: str
    param: str | None = None
    code: str | None = Field(None, description="OpenAI-compatible routes only: OpenAI's error code.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class RewardItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: Text = Field(min_length=1, description="The prompt (question) the response answers.")
    response: Text = Field(description="The response under judgement (response A for pairwise).")
    response_b: Text | None = Field(None, description="The second response; pairwise template only.")
    reference: Text | None = Field(None, description="Optional reference answer shown to the judge.")
    id: str | None = Field(None, max_length=256, description="Echoed back in the result.")


class RewardOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    m: int | None = Field(None, ge=1, le=MAX_M, description="Parallel samples; default EGRM_M.")
    temperatures: list[Annotated[float, Field(ge=0.0, le=2.0)]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_M,
        description="One temperature per sample, each in [0, 2] (length m); default a 0.6..1.0 ladder.",
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tau: float | None = Field(None, ge=0.0, le=1.0, description="Consensus threshold.")
    consensus: Literal["sampled", "exact"] | None = Field(
        None,
        description="Consensus estimator: the samples' vote, or the model's probability of its most "
        "likely short answer (one more, greedy, branch); default EGRM_CONSENSUS.",
    )
    path: Literal["auto", "short", "long"] = "auto"
    template: TemplateLiteral | None = None
    return_samples: bool = False
    seed: int | None = Field(None, ge=0, description="Makes sampling reproducible.")

    @field_validator("temperatures")
    @classmethod
    def _check_temperatures(cls, temps: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if temps is None:
            return temps
        m = info.data.get("m")
        if m is not None and len(temps) != m:
            raise ValueError(f"must have length m={m}, got {len(temps)}")
        return temps


class RewardRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[RewardItem] = Field(min_length=1, description="The pairs to judge.")
    options: RewardOptions = Field(default_factory=RewardOptions)
    model: str | None = Field(None, description="Accepted for client compatibility; ignored.")


RouteLiteral = Literal["short", "long", "reference"]
SharedLiteral = Literal["joined", "cached"]
SHARED_DESCRIPTION = (
    "Where the judge's work on the question came from when this item did not compute it: another item or "
    "request judging the same question at the same time (joined), or one that had finished within the "
    "window (cached); null: computed for this item. Equal answers to one question get one reward."
)


class SampleOut(BaseModel):
    text: str = Field(description="The judge's own short answer to the question.")
    temperature: float
    vote: str | None = Field(
        None, description="What it counted as in the consensus: its class of equivalent answers (null: none)."
    )


class CandidateOut(BaseModel):
    reasoning: str
    answer: str | None = Field(description="The result the reasoning reached (null: none readable).")
    score: float = Field(description="The scorer's quality estimate; the candidates' weight in the vote.")
    verdict: str | None = Field(None, description="Its Yes/No follow-up, where the judge's verdict decided.")


class JudgementOut(BaseModel):
    """One response judged (pairwise: one for A, one for B)."""

    p: float = Field(description="The judge's probability that the response is right, in [0, 1].")
    verdict: Literal["Yes", "No"]
    verdict_by: Literal["equivalence", "judge", "reference"] = Field(
        description="What decided: the judge's own answer against the response's, compared by math-verify "
        "(equivalence); the judge's Yes/No follow-up, where either is not checkable (judge); or the item's "
        "reference against the response's answer (reference)."
    )
    judge_answer: str | None = Field(description="The judge's answer the response was held against.")
    response_answer: str | None = Field(description="The final answer read from the response (null: none).")


class TimingsOut(BaseModel):
    sample_ms: float
    extra_ms: float = Field(0.0, description="Of sample_ms: adaptive M's extra samples, when they were drawn.")
    reasoning_ms: float
    scorer_ms: float
    total_ms: float


class Usage(BaseModel):
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class RewardResult(BaseModel):
    index: int
    id: str | None = None
    reward: float | None = Field(
        description="In [0, 1]; null when the item has an error. verdict and score: the judge's probability "
        "that the response is right; pairwise: the probability that A is the better response."
    )
    answer: str | None = Field(description="verdict: Yes/No; score: 1..10; pairwise: A, B or tie.")
    verdict: Literal["Yes", "No"] | None = Field(None, description="Whether the response is right (not pairwise).")
    verdict_by: Literal["equivalence", "judge", "reference"] | None = Field(
        None, description="What decided the verdict (see judgements)."
    )
    judgements: list[JudgementOut] = Field(default_factory=list, description="One per response (pairwise: A, B).")
    route: RouteLiteral | None
    consensus: float = Field(description="The estimate routing used (options.consensus).")
    votes: dict[str, int] = Field(description="The samples' short answers and how many gave each.")
    exact_consensus: float | None = Field(
        None, description="With consensus=exact: the model's probability of its most likely short answer."
    )
    samples: list[SampleOut] | None = None
    samples_drawn: int = Field(
        0, description="Answer-only samples drawn: M, and adaptive M's extra ones when the vote was borderline."
    )
    candidates: list[CandidateOut] | None = None
    degraded: bool = False
    shared: SharedLiteral | None = Field(None, description=SHARED_DESCRIPTION)
    error: ErrorDetail | None = None
    timings: TimingsOut


class RewardResponse(BaseModel):
    object: Literal["reward.list"] = "reward.list"
    model: str
    routing: str = Field(
        "", description="What routed the auto path: the judge's calibrated policy, or the threshold tau."
    )
    results: list[RewardResult]
    usage: Usage
