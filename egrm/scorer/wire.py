"""What crosses HTTP between the API (HttpScorer) and the scorer worker: pydantic mirrors of Candidate."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from egrm.pipeline.scorer import Candidate

# One call carries one item's candidates (M <= 16); the margin leaves room for a caller that
# batches a few items.
MAX_CANDIDATES = 64
# A rendered judge prompt is at most EGRM_MAX_PROMPT_TOKENS (4096 by default) tokens; a few
# characters per token plus the reasoning fit well under this.
MAX_TEXT_CHARS = 100_000
MAX_ANSWER_CHARS = 256
# Above the largest valid body (UTF-8 text, JSON escapes) of a full batch of typical candidates;
# refused before it is parsed.
MAX_BODY_BYTES = 16 * 1024 * 1024


class CandidateIn(BaseModel):
    """One candidate on the wire; the fields are Candidate's, one for one."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    prompt: str = Field(max_length=MAX_TEXT_CHARS)
    response: str = Field(max_length=MAX_TEXT_CHARS)
    reasoning: str = Field(max_length=MAX_TEXT_CHARS)
    answer: str | None = Field(max_length=MAX_ANSWER_CHARS)
    mean_logprob: float = Field(description="Mean model log-prob of the candidate's tokens (finite).")
    agreement: float = Field(ge=0.0, le=1.0, description="Share of the item's candidates with the same answer.")
    tokens: int = Field(ge=0)
    min_logprob: float = Field(0.0, le=0.0, description="The least likely reasoning token's log-prob.")
    final_logprob: float = Field(0.0, le=0.0, description="Log-prob of the final answer's tokens.")
    finished: bool = Field(True, description="The reasoning reached the final-answer cue within its token limit.")

    def to_candidate(self) -> Candidate:
        return Candidate(**self.model_dump())


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    candidates: list[CandidateIn] = Field(min_length=1, max_length=MAX_CANDIDATES)


class ScoreResponse(BaseModel):
    scores: list[float] = Field(description="One quality estimate in [0, 1] per candidate, in request order.")
    scorer: str = Field(description="Which scorer answered (class name).")
    # False where a worker does not say: early stop then never acts on its scores.
    calibrated: bool = Field(False, description="Whether a score reads as the probability that the candidate is right.")
