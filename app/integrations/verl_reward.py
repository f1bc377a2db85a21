"""veRL custom reward functions that ask a running egrm service for E-GRM judgements.

veRL loads this file by path (verl/trainer/ppo/reward.py, get_custom_reward_fn: the config's
custom_reward_function.path, .name, and .reward_kwargs passed to every call):

    custom_reward_function.path=<site-packages>/app/integrations/verl_reward.py
    custom_reward_function.name=compute_score          # reward_model.reward_manager=naive: one item a call
    custom_reward_function.name=compute_score_batch    # reward_model.reward_manager=batch: the whole batch
    +custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000

The signatures are those veRL's reward managers call: NaiveRewardManager passes data_source,
solution_str, ground_truth, extra_info (verl/workers/reward_manager/naive.py); BatchRewardManager
passes data_sources, solution_strs, ground_truths, extra_infos (verl/workers/reward_manager/batch.py).
veRL does not pass the prompt: it is read from extra_info["question"] (what veRL's gsm8k/math
preprocessing stores) or extra_info["prompt"] (a string or chat messages). The ground truth is
shown to the judge as the reference answer.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from app.client import AsyncEgrmClient, EgrmClient, EgrmError
from app.protocol import RewardResult

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8000"


def compute_score(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    url: str | None = None,
    api_key: str | None = None,
    options: Mapping[str, Any] | None = None,
    **_: Any,
) -> float:
    """The reward in [0, 1] for one response (veRL's NaiveRewardManager form)."""
    item = _item(0, solution_str, ground_truth, extra_info)
    (result,) = _sync_client(url or os.environ.get("EGRM_URL", DEFAULT_URL), _key(api_key)).score([item], options)
    return _reward(0, result)


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
    *,
    url: str | None = None,
    api_key: str | None = None,
    options: Mapping[str, Any] | None = None,
    batch_size: int = 64,
    concurrency: int = 4,
    **_: Any,
) -> list[float]:
    """One reward per response, in order (veRL's BatchRewardManager form): batched, concurrent requests."""
    infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    items = [_item(i, s, g, e) for i, (s, g, e) in enumerate(zip(solution_strs, ground_truths, infos, strict=True))]

    async def score() -> list[RewardResult]:
        target = url or os.environ.get("EGRM_URL", DEFAULT_URL)
        async with AsyncEgrmClient(
            target, api_key=_key(api_key), batch_size=batch_size, concurrency=concurrency
        ) as client:
            return await client.score(items, options)

    return [_reward(i, r) for i, r in enumerate(_run(score()))]


def _item(i: int, solution: str, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> dict[str, Any]:
    prompt = _prompt(extra_info)
    if not prompt:
        raise ValueError(
            f"item {i}: no prompt for the judge: put the question in extra_info['question'] "
            "(or extra_info['prompt']) when preparing the veRL dataset"
        )
    reference = None if ground_truth is None or ground_truth == "" else str(ground_truth)
    return {"prompt": prompt, "response": solution, "reference": reference}


def _prompt(extra_info: Mapping[str, Any] | None) -> str:
    info = extra_info or {}
    value = info.get("question") or info.get("prompt") or ""
    if isinstance(value, str):
        return value
    # Chat messages (veRL datasets keep the prompt as [{"role": ..., "content": ...}]): the last user turn.
    users = [m.get("content", "") for m in value if isinstance(m, Mapping) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _reward(i: int, result: RewardResult) -> float:
    if result.reward is None:
        message = result.error.message if result.error else "no reward"
        raise EgrmError(f"item {i} could not be judged: {message}")
    return result.reward


def _key(api_key: str | None) -> str | None:
    return api_key or os.environ.get("EGRM_API_KEY") or None


@lru_cache(maxsize=8)
def _sync_client(url: str, api_key: str | None) -> EgrmClient:
    """One client (one connection pool) per service, reused by every call in this worker."""
    return EgrmClient(url, api_key=api_key)


def _run(work: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion, also when the caller is itself inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    out: dict[str, Any] = {}

    def runner() -> None:
        try:
            out["value"] = asyncio.run(work)
        except BaseException as exc:  # handed to the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=runner, name="egrm-verl")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
