"""POST /get_reward: OpenRLHF's remote reward model (`--remote_rm_url http://host:port/get_reward`).

Contract checked against OpenRLHF's source: openrlhf/utils/remote_rm_utils.py (remote_rm_fn
posts {"query", "prompts", "labels"} and reads "rewards") and openrlhf/cli/serve_rm.py (answers
{"rewards", "scores", "extra_logs"}).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.deps import MetricsDep, PipelineDep, SettingsDep
from app.api.errors import ApiError
from app.api.scoring import ERROR_RESPONSES, check_item_count, raise_item_errors, resolve_options, score_items
from app.pipeline.types import JudgeItem, Route
from app.protocol import RewardOptions
from app.protocol_openrlhf import GetRewardRequest, GetRewardResponse

router = APIRouter()

# What a policy's tokenizer leaves at the end of a decoded query (its end of turn, EOS, padding),
# across the chat formats in use: not part of the response.
END_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "</s>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<eos>",
    "<|eos|>",
    "<pad>",
    "[PAD]",
    "<|pad|>",
    "<|finetune_right_pad_id|>",
    "<｜end▁of▁sentence｜>",
)


def without_end_markers(response: str) -> str:
    """The response less the end-of-sequence and padding text after it."""
    stripped = response.rstrip()
    while marker := next((m for m in END_MARKERS if stripped.endswith(m)), None):
        stripped = stripped.removesuffix(marker).rstrip()
    return stripped


def _query(i: int) -> str:
    return f"query[{i}]"


def judge_items(body: GetRewardRequest) -> list[JudgeItem]:
    """Split each query into (prompt, response) with its prompt; labels become references.

    Without prompts the whole query is judged as the response to an empty prompt: OpenRLHF's older
    remote_rm_fn sends the query alone, and the policy's chat template is unknown here, so no
    split would be reliable.
    """
    for name in ("prompts", "labels"):
        values = getattr(body, name)
        if values is not None and len(values) != len(body.query):
            raise ApiError(422, f"{name} has {len(values)} entries for {len(body.query)} queries", name)
    items = []
    for i, query in enumerate(body.query):
        prompt = body.prompts[i] if body.prompts is not None else ""
        if not query.startswith(prompt):
            raise ApiError(422, f"query[{i}] does not start with prompts[{i}]; query = prompt + response", _query(i))
        label = body.labels[i] if body.labels is not None else None
        reference = None if label is None or label == "" else str(label)
        response = without_end_markers(query[len(prompt) :])
        items.append(JudgeItem(prompt=prompt, response=response, reference=reference))
    return items


@router.post("/get_reward", response_model=GetRewardResponse, responses=ERROR_RESPONSES)
async def get_reward(
    body: GetRewardRequest, request: Request, pipeline: PipelineDep, settings: SettingsDep, metrics: MetricsDep
) -> GetRewardResponse:
    check_item_count(len(body.query), settings, "query")
    options = resolve_options(body.egrm or RewardOptions(), settings)
    if options.template == "pairwise":
        message = "egrm.template: pairwise needs two responses per item; use POST /v1/rewards"
        raise ApiError(422, message, "egrm.template")
    items = judge_items(body)
    results, _ = await score_items(request, pipeline, settings, metrics, "/get_reward", items, options, _query)
    # OpenRLHF turns rewards into a tensor: a hole would break its batch, so a failed item fails the request.
    raise_item_errors(results, _query)
    rewards = [float(r.reward or 0.0) for r in results]
    return GetRewardResponse(
        rewards=rewards,
        scores=rewards,
        extra_logs={
            "egrm_consensus": [r.consensus for r in results],
            "egrm_verdict": [1.0 if r.judgements and r.judgements[0].right else 0.0 for r in results],
            "egrm_long_route": [1.0 if r.route is Route.LONG else 0.0 for r in results],
        },
    )
