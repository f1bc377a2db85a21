"""Wire models of OpenRLHF's remote reward model contract (POST /get_reward).

OpenRLHF's trainer posts {"query": [...], "prompts": [...], "labels": [...]} and reads
"rewards", "scores" and "extra_logs" back; see OpenRLHF openrlhf/utils/agent.py
(SingleTurnAgentExecutor._fetch_rewards_via_http: one query per POST, many in flight, 180 s
total per try, 5 tries 1 s apart, any error status retried; with several reward URLs the others
get empty lists, which must answer 200), the older openrlhf/utils/remote_rm_utils.py, and
openrlhf/cli/serve_rm.py (the reference server: {"rewards", "scores", "extra_logs"}).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from egrm.protocol import RewardOptions, Text


class GetRewardRequest(BaseModel):
    # OpenRLHF's forks add keys (datasources, query_token_ids, ...); its servers read what they
    # know with data.get(), so unknown keys are ignored here too.
    model_config = ConfigDict(extra="ignore")

    query: list[Text] = Field(description="Prompt + response, as the policy's tokenizer decoded them.")
    prompts: list[Text] | None = Field(
        None, description="The prompt of each query (a prefix of it); absent: the whole query is the response."
    )
    labels: list[Any] | None = Field(
        None,
        description="Ground truth per query (--label_key), any JSON value as OpenRLHF passes its dataset's: "
        "one that reads as a number decides by itself; any other is shown to the judge as the reference.",
    )
    egrm: RewardOptions | None = Field(None, description="egrm's own options (m, tau, path, template, ...).")


class GetRewardResponse(BaseModel):
    rewards: list[float] = Field(description="One reward in [0, 1] per query.")
    scores: list[float] = Field(description="The same values (OpenRLHF filters on scores in [0, 1]).")
    extra_logs: dict[str, list[float]] = Field(
        description="Per-query values OpenRLHF logs: consensus, verdict (1 right, 0 wrong), long route."
    )
