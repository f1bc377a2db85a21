"""Wire models of the OpenAI-compatible endpoints (/v1/models, /v1/chat/completions).

Shapes follow OpenAI's Chat Completions API as the official `openai` SDK parses them; the
reward details ride in the extra top-level field `egrm`, which the SDK keeps in `model_extra`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from egrm.protocol import (
    SHARED_DESCRIPTION,
    CandidateOut,
    JudgementOut,
    RewardOptions,
    RouteLiteral,
    SampleOut,
    SharedLiteral,
    TimingsOut,
    unicode_text,
)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Clients add fields such as `name` or `refusal`; the judge reads role and content only.
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(None, description="A string or a list of text parts.")

    @field_validator("content")
    @classmethod
    def _unicode_content(cls, content: str | list[TextPart] | None) -> str | list[TextPart] | None:
        for text in [content] if isinstance(content, str) else [p.text for p in content or []]:
            unicode_text(text)
        return content

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


INT64 = 2**63  # OpenAI's seed is any signed 64-bit integer (openapi.yaml: integer, format int64)


class ChatCompletionRequest(BaseModel):
    """Every parameter of OpenAI's Chat Completions create (openai-python 3.x, `completions.create`):
    mapped where it means something for a judgement, accepted and ignored (logged once) where it
    does not, refused only where accepting it would mislead (see egrm/api/openai_chat.py). A field
    OpenAI does not have is refused (unknown_parameter)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="The served model id (see GET /v1/models) or the alias 'egrm'.")
    messages: list[ChatMessage] = Field(
        min_length=2,
        description="The conversation to judge: the last message is the assistant response under judgement, "
        "the user message before it the prompt; system messages reach the judge as the reference.",
    )
    # Mapped.
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="The nucleus of every judge sample.")
    seed: int | None = Field(None, ge=-INT64, lt=INT64, description="Makes the judge's sampling reproducible.")
    stream: bool | None = Field(None, description="True: the judgement as server-sent events (chat.completion.chunk).")
    stream_options: dict[str, Any] | None = Field(
        None, description="include_usage: a last chunk with the usage and no choices, as OpenAI sends it."
    )
    # Refused when they ask for what a judgement cannot be (see openai_chat.REFUSED).
    n: int | None = Field(None, description="Only 1: one judgement per request (egrm.m sets the samples).")
    response_format: dict[str, Any] | None = Field(None, description="Only {'type': 'text'}: the judgement is text.")
    tools: list[Any] | None = Field(None, description="Accepted; the judge calls none (tool_choice must allow that).")
    tool_choice: str | dict[str, Any] | None = Field(None, description="none or auto: the judge answers in text.")
    functions: list[Any] | None = Field(None, description="Deprecated by OpenAI; as tools.")
    function_call: str | dict[str, Any] | None = Field(None, description="Deprecated by OpenAI; none or auto.")
    modalities: list[str] | None = Field(None, description="Only text: the judgement is text.")
    audio: dict[str, Any] | None = Field(None, description="Refused: the judgement is text.")
    # Accepted, ignored (logged once): sampling the judge does its own way, and bookkeeping.
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description="Ignored (logged): the judge samples a ladder; set egrm.temperatures."
    )
    max_tokens: int | None = Field(None, ge=1, description="Ignored (logged): the judgement is a few tokens.")
    max_completion_tokens: int | None = Field(None, ge=1, description="Ignored (logged).")
    stop: str | list[str] | None = Field(None, description="Ignored (logged).")
    logprobs: bool | None = Field(None, description="Ignored (logged); the reward is the judge's probability.")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="Ignored (logged).")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="Ignored (logged).")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="Ignored (logged).")
    logit_bias: dict[str, float] | None = Field(None, description="Ignored (logged).")
    parallel_tool_calls: bool | None = Field(None, description="Ignored.")
    prediction: dict[str, Any] | None = Field(None, description="Ignored (logged).")
    reasoning_effort: str | None = Field(
        None, description="Ignored (logged): the route decides when the judge reasons."
    )
    verbosity: str | None = Field(None, description="Ignored (logged).")
    web_search_options: dict[str, Any] | None = Field(None, description="Ignored (logged): the judge does not search.")
    moderation: Any = Field(None, description="Ignored (logged).")
    service_tier: str | None = Field(None, description="Ignored.")
    store: bool | None = Field(None, description="Ignored: nothing is stored.")
    metadata: dict[str, str] | None = Field(None, description="Ignored.")
    user: str | None = Field(None, description="Ignored.")
    safety_identifier: str | None = Field(None, description="Ignored.")
    prompt_cache_key: str | None = Field(None, description="Ignored: the prefix cache is egrm's own.")
    prompt_cache_options: dict[str, Any] | None = Field(None, description="Ignored.")
    prompt_cache_retention: str | None = Field(None, description="Ignored.")
    egrm: RewardOptions | None = Field(
        None, description="egrm's own options (m, temperatures, tau, path, template, ...); SDK: extra_body."
    )


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    finish_reason: Literal["stop"] = "stop"
    logprobs: None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class EgrmJudgement(BaseModel):
    """What /v1/rewards returns for one item, less the index and id."""

    reward: float = Field(description="In [0, 1]: the judge's probability that the response is right.")
    answer: str
    verdict: Literal["Yes", "No"] | None = None
    verdict_by: Literal["equivalence", "judge", "reference"] | None = None
    judgements: list[JudgementOut] = Field(default_factory=list)
    route: RouteLiteral
    consensus: float
    votes: dict[str, int]
    exact_consensus: float | None = None
    template: str
    samples: list[SampleOut] | None = None
    candidates: list[CandidateOut] | None = None
    degraded: bool = False
    shared: SharedLiteral | None = Field(None, description=SHARED_DESCRIPTION)
    timings: TimingsOut


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage
    egrm: EgrmJudgement


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed judgement (OpenAI's chat.completion.chunk)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: ChatUsage | None = None
    egrm: EgrmJudgement | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "egrm"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
