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

import app.integrations.verl_reward as verl_reward
from app.client import EgrmAPIError
from app.config import Settings
from app.main import create_app
from tests.live import serve

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 2+2?", "What is the capital of France?", "What is 3*3?"]
SOLUTIONS = ["4", "Berlin", "9"]
TRUTHS = ["4", "Paris", "9"]


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serve(create_app(Settings(max_items=2), engine=engine)) as base:
        yield base


def load_like_verl(name: str, reward_kwargs: dict):
    """verl/trainer/ppo/reward.py get_custom_reward_fn: import the file by path, wrap with reward_kwargs."""
    spec = importlib.util.spec_from_file_location("custom_module", Path(verl_reward.__file__))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw_fn = getattr(module, name)

    def wrapped_fn(*args, **kwargs):
        return raw_fn(*args, **kwargs, **reward_kwargs)

    return wrapped_fn


def test_naive_manager_form(url):
    compute_score = load_like_verl("compute_score", {"url": url, "options": {"path": "short", "seed": 1}})
    # NaiveRewardManager's call (verl/workers/reward_manager/naive.py).
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
    # BatchRewardManager's call (verl/workers/reward_manager/batch.py): non-tensor batch fields are numpy arrays.
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
    assert inspect.iscoroutinefunction(importlib.import_module("app.integrations.verl_reward").compute_score_async)

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
