"""From a wire item (/v1/rewards, `egrm score`) to what the judge reads.

A prompt in a policy's chat format is read as its question, and a response loses the end markers a
policy's decode leaves (egrm/chat_text.py): the judge sees what was asked and answered. The route
and `egrm score` in-process both read items here, so a file gets the rewards the server gives.
"""

from __future__ import annotations

from egrm.chat_text import plain_prompt, without_end_markers
from egrm.pipeline.types import JudgeItem
from egrm.protocol import RewardItem


def judge_item(item: RewardItem) -> JudgeItem:
    response_b = None if item.response_b is None else without_end_markers(item.response_b)
    return JudgeItem(plain_prompt(item.prompt), without_end_markers(item.response), response_b, item.reference, item.id)
