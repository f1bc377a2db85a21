"""Wire models of OpenRLHF's remote reward model contract (POST /get_reward).

OpenRLHF's trainer posts {"query": [...], "prompts": [...], "labels": [...]} and reads
"rewards" (and, in its custom-reward form, "scores" and "extra_logs") back; see OpenRLHF
openrlhf/utils/remote_rm_utils.py (remote_rm_fn: the request) and openrlhf/cli/serve_rm.py
(the reference server: {"rewards", "scores", "extra_logs"}).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.protocol import RewardOptions


class GetRewardRequest(BaseModel):
    # OpenRLHF's forks add keys (datasources, query_token_ids, ...); its servers read what they
    # know with data.get(), so unknown keys are ignored here too.
    model_config = ConfigDict(extra="ignore")

    query: list[str] = Field(min_length=1, description="Prompt + response, as the policy's tokenizer decoded them.")
    prompts: list[str] | None = Field(
        None, description="The prompt of each query (a prefix of it); absent: the whole query is the response."
    )
    labels: list[str | int | float | None] | None = Field(
        None, description="Ground truth per query (--label_key); shown to the judge as the reference answer."
    )
    egrm: RewardOptions | None = Field(None, description="egrm's own options (m, tau, path, template, ...).")


class GetRewardResponse(BaseModel):
    rewards: list[float] = Field(description="One reward in [0, 1] per query.")
    scores: list[float] = Field(description="The same values (OpenRLHF filters on scores in [0, 1]).")
    extra_logs: dict[str, list[float]] = Field(
        description="Per-query values OpenRLHF logs: consensus, verdict (1 right, 0 wrong), long route."
    )
