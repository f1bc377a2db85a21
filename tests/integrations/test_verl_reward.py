"""The veRL reward module, loaded and called the way veRL does, against a real egrm server."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import egrm.integrations.verl_reward as verl_reward
from egrm.client import EgrmAPIError
from egrm.config import Settings
from egrm.main import create_app
from tests.live import serve

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 2+2?", "What is the capital of France?", "What is 3*3?"]
SOLUTIONS = ["4", "Berlin", "9"]
TRUTHS = ["4", "Paris", "9"]


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serve(create_app(Settings(max_items=2), engine=engine)) as base:
        yield base


# veRL cannot be imported here: `import verl` imports ray, tensordict and torch.distributed
# (verl/__init__.py -> protocol.py), and verl's setup.py pins transformers<5.11 beside this
# project's 5.x. So the calls below are veRL's, copied from verl-project/verl at 1dda039
# (2026-08-22): verl/trainer/ppo/reward.py get_custom_reward_fn and
# verl/experimental/reward_loop/reward_manager/naive.py run_single.
VERL_COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"
# verl/experimental/reward_loop/reward_manager/registry.py REWARD_MANAGER at that commit (its
# __init__.py registers these); verl/workers/config/reward.py RewardManagerConfig.__post_init__
# asserts the configured name is one of them.
REGISTERED_MANAGERS = frozenset({"dapo", "gdpo", "naive", "rate_limited", "remote"})


def load_like_verl(name: str, reward_kwargs: dict):
    """get_custom_reward_fn: import the file by path, wrap with reward_kwargs (which override the
    call's own keywords: merged_kwargs = {**kwargs, **extra_kwargs}); a coroutine stays one."""
    spec = importlib.util.spec_from_file_location("custom_module", Path(verl_reward.__file__))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw_fn = getattr(module, name)

    if inspect.iscoroutinefunction(raw_fn):

        async def wrapped_async(*args, **kwargs):
            return await raw_fn(*args, **{**kwargs, **reward_kwargs})

        return wrapped_async

    def wrapped_fn(*args, **kwargs):
        return raw_fn(*args, **{**kwargs, **reward_kwargs})

    return wrapped_fn


def test_the_readme_config_names_a_manager_todays_verl_accepts():
    import re

    import yaml

    page = (Path(__file__).parents[2] / "docs" / "integrations.md").read_text()
    block = re.search(r"## veRL\n.*?```yaml\n(.*?)```", page, re.S)
    assert block, "docs/integrations.md's veRL section shows its config"
    config = yaml.safe_load(block.group(1))["reward"]
    assert config["reward_manager"]["name"] in REGISTERED_MANAGERS
    assert config["custom_reward_function"]["name"] == "compute_score_async"  # naive awaits a coroutine
    assert inspect.iscoroutinefunction(getattr(verl_reward, config["custom_reward_function"]["name"]))


def test_the_naive_managers_call_with_a_reward_router(url):
    """naive.py run_single, when veRL serves the reward model behind a router: two more keywords,
    the router's address as host:port; without reward_kwargs.url it is where egrm answers."""
    compute_score = load_like_verl("compute_score_async", {"options": {"path": "short", "seed": 1}})
    host_port = url.removeprefix("http://")
    score = asyncio.run(
        compute_score(
            data_source="openai/gsm8k",
            solution_str="4",
            ground_truth="4",
            extra_info={"split": "train", "index": 0, "question": "What is 2+2?", "num_turns": 2},
            reward_router_address=host_port,
            reward_model_tokenizer=object(),
        )
    )
    assert score == 1.0


def test_naive_manager_form(url):
    compute_score = load_like_verl("compute_score", {"url": url, "options": {"path": "short", "seed": 1}})
    # The naive manager's call (reward_manager/naive.py run_single, a sync function in an executor).
    score = compute_score(
        data_source="openai/gsm8k",
        solution_str="4",
        ground_truth="4",
        extra_info={"split": "train", "index": 0, "question": "What is 2+2?"},
    )
    assert score in (0.0, 1.0)


def test_batch_manager_form(url):
    compute_score_batch = load_like_verl(
        "compute_score_batch", {"url": url, "options": {"path": "short"}, "batch_size": 2, "concurrency": 2}
    )
    # The legacy BatchRewardManager's call (verl/workers/reward_manager/batch.py; veRL releases whose
    # config still took `batch`): non-tensor batch fields are numpy arrays.
    scores = compute_score_batch(
        data_sources=np.array(["gsm8k"] * 3, dtype=object),
        solution_strs=SOLUTIONS,
        ground_truths=TRUTHS,
        extra_infos=np.array([{"question": q} for q in QUESTIONS], dtype=object),
    )
    # 3 items, the server takes 2 a request. The numbers' ground truths decide by themselves; "Berlin"
    # against "Paris" is the judge's Yes/No, whose probability of Yes is the reward.
    assert len(scores) == 3 and scores[0] == scores[2] == 1.0 and 0.0 <= scores[1] < 0.5


def test_batch_form_inside_a_running_event_loop(url):
    async def trainer_step() -> list[float]:  # veRL's async reward loop calls from inside a loop
        return verl_reward.compute_score_batch(
            ["x"], ["4"], ["4"], [{"prompt": [{"role": "user", "content": "What is 2+2?"}]}], url=url
        )

    assert len(asyncio.run(trainer_step())) == 1


def test_missing_prompt_and_server_refusals_are_clear(url):
    with pytest.raises(ValueError, match=r"extra_info\['question'\]"):
        verl_reward.compute_score("x", "4", "4", {"index": 3}, url=url)
    with pytest.raises(EgrmAPIError) as err:
        verl_reward.compute_score("x", "4", "4", {"question": "2+2?"}, url=url, options={"tau": 3})
    assert err.value.param == "options.tau"


def test_the_async_form_is_awaited_like_verls_reward_loop(url):
    """veRL awaits an `async def` reward function (inspect.iscoroutinefunction), many at once."""
    compute_score_async = load_like_verl("compute_score_async", {"url": url, "options": {"path": "short", "seed": 1}})
    assert inspect.iscoroutinefunction(importlib.import_module("egrm.integrations.verl_reward").compute_score_async)

    async def rollout() -> list[float]:
        calls = [
            compute_score_async(data_source="gsm8k", solution_str=s, ground_truth=t, extra_info={"question": q})
            for q, s, t in zip(QUESTIONS, SOLUTIONS, TRUTHS, strict=True)
        ]
        return list(await asyncio.gather(*calls))

    scores = asyncio.run(rollout())
    assert scores[0] == scores[2] == 1.0 and 0.0 <= scores[1] < 0.5


def test_details_give_the_same_keys_for_every_item(url):
    compute_score_batch = load_like_verl("compute_score_batch", {"url": url, "details": True, "batch_size": 2})
    out = compute_score_batch(["gsm8k"] * 3, SOLUTIONS, TRUTHS, [{"question": q} for q in QUESTIONS])
    assert [set(d) for d in out] == [{"score", "reward", "consensus", "route"}] * 3
    assert [d["route"] for d in out] == ["reference", out[1]["route"], "reference"] and out[0]["score"] == 1.0
    assert all(d["score"] == d["reward"] for d in out)
