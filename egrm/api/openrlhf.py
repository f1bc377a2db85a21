"""POST /get_reward: OpenRLHF's remote reward model (`--reward.remote_url http://host:port/get_reward`).

Contract checked against OpenRLHF's source (see egrm/protocol_openrlhf.py): openrlhf/utils/agent.py
posts {"query", "prompts", "labels"} one query at a time and reads "rewards", "scores" and
"extra_logs"; openrlhf/cli/serve_rm.py answers the same keys.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from egrm.api.deps import MetricsDep, PipelineDep, SettingsDep
from egrm.api.errors import ApiError
from egrm.api.scoring import ERROR_RESPONSES, check_item_count, raise_item_errors, resolve_options, score_items
from egrm.chat_text import split_query
from egrm.pipeline.types import ItemResult, JudgeItem, Route
from egrm.protocol import RewardOptions, unicode_text
from egrm.protocol_openrlhf import GetRewardRequest, GetRewardResponse

router = APIRouter()


def _query(i: int) -> str:
    return f"query[{i}]"


def judge_items(body: GetRewardRequest) -> list[JudgeItem]:
    """Each query's question and response (egrm.chat_text.split_query: out of the policy's chat
    markup, less its end markers); labels become references."""
    for name in ("prompts", "labels"):
        values = getattr(body, name)
        if values is not None and len(values) != len(body.query):
            raise ApiError(422, f"{name} has {len(values)} entries for {len(body.query)} queries", name)
    items = []
    for i, query in enumerate(body.query):
        split = split_query(query, body.prompts[i] if body.prompts is not None else None)
        reference = label_text(body.labels[i]) if body.labels is not None else None
        items.append(JudgeItem(prompt=split.prompt, response=split.response, reference=reference))
    return items


# Where a dataset's label is an object, the keys its answer is most often under.
_ANSWER_KEYS = ("answer", "ground_truth", "reference", "solution", "label", "target")


def label_text(label: Any) -> str | None:
    """A label as the reference: OpenRLHF passes its dataset's value through, any JSON type
    (prompts_dataset.py: data[label_key]). A scalar is its text; an object its answer under a
    usual key, else its JSON; a list of one its item, else its JSON; null, "" and text that is
    not valid Unicode are no reference. Never a refusal: the trainer would drop the reward."""
    if isinstance(label, dict):
        answer = next((label[k] for k in _ANSWER_KEYS if isinstance(label.get(k), str | int | float)), None)
        return label_text(answer) if answer is not None else json.dumps(label, ensure_ascii=False)
    if isinstance(label, list):
        return label_text(label[0]) if len(label) == 1 else json.dumps(label, ensure_ascii=False)
    if label is None or label == "":
        return None
    text = str(label)
    try:
        unicode_text(text)
    except ValueError:
        return None
    return text


# What OpenRLHF logs per query beside the reward.
EXTRA_LOGS: dict[str, Callable[[ItemResult], float]] = {
    "egrm_consensus": lambda r: r.consensus,
    "egrm_verdict": lambda r: 1.0 if r.judgements and r.judgements[0].right else 0.0,
    "egrm_long_route": lambda r: 1.0 if r.route is Route.LONG else 0.0,
    "egrm_shared": lambda r: 0.0 if r.shared is None else 1.0,  # the question's work came from another query
}


@router.post("/get_reward", response_model=GetRewardResponse, responses=ERROR_RESPONSES)
async def get_reward(
    body: GetRewardRequest, request: Request, pipeline: PipelineDep, settings: SettingsDep, metrics: MetricsDep
) -> GetRewardResponse:
    check_item_count(len(body.query), settings, "query")
    options = resolve_options(body.egrm or RewardOptions(), settings, pipeline.policy)
    if options.template == "pairwise":
        message = "egrm.template: pairwise needs two responses per item; use POST /v1/rewards"
        raise ApiError(422, message, "egrm.template")
    items = judge_items(body)
    if not items:  # OpenRLHF with several reward URLs sends the others empty lists
        return GetRewardResponse(rewards=[], scores=[], extra_logs={key: [] for key in EXTRA_LOGS})
    results, _ = await score_items(request, pipeline, settings, metrics, "/get_reward", items, options, _query)
    # OpenRLHF turns rewards into a tensor: a hole would break its batch, so a failed item fails the request.
    raise_item_errors(results, _query, settings)
    rewards = [float(r.reward or 0.0) for r in results]
    return GetRewardResponse(
        rewards=rewards,
        scores=rewards,
        extra_logs={key: [value(r) for r in results] for key, value in EXTRA_LOGS.items()},
    )
