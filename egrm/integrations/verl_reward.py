"""veRL custom reward functions that ask a running egrm service for E-GRM judgements.

veRL loads this file by path (verl/trainer/ppo/reward.py, get_custom_reward_fn: the config's
reward.custom_reward_function.path, .name, and .reward_kwargs merged into every call, overriding
its keywords; an `async def` function is awaited):

    reward.reward_manager.name=naive  # today's registry: naive, dapo, gdpo, rate_limited, remote
    reward.custom_reward_function.path=<site-packages>/app/integrations/verl_reward.py
    reward.custom_reward_function.name=compute_score_async
    +reward.custom_reward_function.reward_kwargs.url=http://127.0.0.1:8000

The signatures are those veRL's reward managers call (verl-project/verl 1dda039,
verl/experimental/reward_loop/reward_manager/naive.py: data_source, solution_str, ground_truth,
extra_info, and reward_router_address, reward_model_tokenizer when veRL serves a reward model
behind a router; the legacy verl/workers/reward_manager/batch.py, which today's config no longer
accepts: data_sources, solution_strs, ground_truths, extra_infos). With reward_kwargs details=true each returns a dict
({"score", "reward", "consensus", "route"}) that veRL logs as reward_extra_info. veRL does not
pass the prompt: it is read from extra_info["question"] (what veRL's gsm8k preprocessing stores)
or extra_info["prompt"] (a string, chat-formatted or not, or chat messages). The ground truth is
the reference: one that reads as a number decides by itself.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from egrm.client import AsyncEgrmClient, EgrmClient, EgrmError
from egrm.protocol import RewardResult

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
    details: bool = False,
    reward_router_address: str | None = None,
    **_: Any,
) -> float | dict[str, Any]:
    """The reward in [0, 1] for one response (veRL's naive manager form); with details=True a dict
    veRL logs as reward_extra_info (its "score" is the reward)."""
    item = _item(0, solution_str, ground_truth, extra_info)
    (result,) = _sync_client(_url(url, reward_router_address), _key(api_key)).score([item], options)
    return _out(0, result, details)


async def compute_score_async(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    url: str | None = None,
    api_key: str | None = None,
    options: Mapping[str, Any] | None = None,
    details: bool = False,
    reward_router_address: str | None = None,
    **_: Any,
) -> float | dict[str, Any]:
    """compute_score as a coroutine: veRL's reward loop awaits an `async def` reward function
    (inspect.iscoroutinefunction in verl/trainer/ppo/reward.py and its reward managers), so
    thousands of items are in flight on one event loop instead of one thread each."""
    item = _item(0, solution_str, ground_truth, extra_info)
    async with AsyncEgrmClient(_url(url, reward_router_address), api_key=_key(api_key)) as client:
        (result,) = await client.score([item], options)
    return _out(0, result, details)


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
    details: bool = False,
    **_: Any,
) -> list[float | dict[str, Any]]:
    """One reward per response, in order (veRL's batch manager form): batched, concurrent requests."""
    infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    items = [_item(i, s, g, e) for i, (s, g, e) in enumerate(zip(solution_strs, ground_truths, infos, strict=True))]

    async def score() -> list[RewardResult]:
        async with AsyncEgrmClient(
            _url(url), api_key=_key(api_key), batch_size=batch_size, concurrency=concurrency
        ) as client:
            return await client.score(items, options)

    return [_out(i, r, details) for i, r in enumerate(_run(score()))]


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


def _details(i: int, result: RewardResult) -> dict[str, Any]:
    """The same keys for every item (veRL reads the first item's keys from all of them)."""
    reward = _reward(i, result)
    route = result.route or ""
    return {"score": reward, "reward": reward, "consensus": result.consensus, "route": route}


def _out(i: int, result: RewardResult, details: bool) -> float | dict[str, Any]:
    return _details(i, result) if details else _reward(i, result)


def _url(url: str | None, router_address: str | None = None) -> str:
    """Where egrm answers: the url of reward_kwargs, else the reward router veRL passes (its
    naive manager sends reward_router_address when it serves the reward model behind a router:
    there, egrm), else EGRM_URL, else the default. veRL gives the router as host:port."""
    if url:
        return url
    if router_address:
        return router_address if "://" in router_address else f"http://{router_address}"
    return os.environ.get("EGRM_URL", DEFAULT_URL)


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
