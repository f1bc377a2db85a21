"""Shared fixtures: the real default model, loaded once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from egrm.config import Settings
from egrm.engines.embedded.engine import EmbeddedEngine
from egrm.engines.embedded.fetch import fetch_model
from egrm.engines.embedded.loader import LoadedModel, load_model, resolve_dtype
from egrm.engines.remote.tokenizer import LocalTokenizer, load_tokenizer
from egrm.factory import judge_model_path
from egrm.pipeline.verifier import MathVerifyChecker


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests against a live SGLang runtime run only where one is named; elsewhere they are
    skipped with the reason in the summary (-ra), never counted as passed."""
    if os.environ.get("EGRM_SGLANG_URL"):
        return
    skip = pytest.mark.skip(reason="needs a live SGLang runtime: set EGRM_SGLANG_URL (see deploy/gpu-check.sh)")
    for item in items:
        if item.get_closest_marker("sglang") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def checker() -> Iterator[MathVerifyChecker]:
    """One answer checker (math-verify in its worker process) for every pipeline a test builds."""
    import asyncio

    checker = MathVerifyChecker()
    yield checker
    asyncio.run(checker.close())


@pytest.fixture(scope="session")
def base_model_path() -> Path:
    """The converted default model, as fetched (`make test` fetches it first; idempotent here)."""
    return fetch_model(Settings().cache_dir)


@pytest.fixture(scope="session")
def model_path(base_model_path: Path) -> Path:
    """The served default: the fetched model with the judge adapter merged in (once, cached)."""
    return judge_model_path(Settings())


@pytest.fixture(scope="session")
def tok(base_model_path: Path) -> LocalTokenizer:
    """The default model's tokenizer alone, as the remote engines load it (from the base model's
    folder: a remote backend serves its own weights, the adapter is an embedded-engine affair)."""
    return load_tokenizer(base_model_path)


@pytest.fixture(scope="session")
def loaded_fp32(model_path: Path) -> LoadedModel:
    """fp32: batched and single-row kernels agree token for token only in fp32."""
    return load_model(model_path, dtype="float32")


@pytest.fixture(scope="session")
def loaded_served(request: pytest.FixtureRequest, model_path: Path) -> LoadedModel:
    """The dtype `egrm serve` loads (auto: bfloat16 where the CPU computes it natively, float32
    elsewhere): what the service, its pipeline and its evaluations are tested on. Where that is
    float32, the float32 model already loaded (one copy, one load)."""
    dtype = resolve_dtype(Settings().dtype)
    if dtype == "float32":
        return request.getfixturevalue("loaded_fp32")
    return load_model(model_path, dtype=dtype)


@pytest.fixture(scope="session")
def engine(loaded_served: LoadedModel) -> Iterator[EmbeddedEngine]:
    """The serving default: lean forward, branches in one sequence, the served dtype (the engine's
    own tests, which compare tokens across batch shapes and with other engines, override it with
    float32 in tests/engines/conftest.py)."""
    yield from embedded_engine(loaded_served)


@pytest.fixture(scope="session")
def exact_engine(loaded_fp32: LoadedModel) -> Iterator[EmbeddedEngine]:
    """The serving default's forward and layout in float32, for tests that compare two ways of
    computing one thing (batch shapes, sharing on and off, a replica's restored work, another
    engine): in bfloat16 the arithmetic, and so a sampled token, depends on the batch's shape."""
    yield from embedded_engine(loaded_fp32)


# Every engine variant: the two layouts of the lean forward, and the generic transformers path.
VARIANTS = {"sequence": {"layout": "sequence"}, "batch": {"layout": "batch"}, "generic": {"lean": False}}


@pytest.fixture(scope="session", params=list(VARIANTS))
def any_engine(request: pytest.FixtureRequest, loaded_fp32: LoadedModel) -> Iterator[EmbeddedEngine]:
    yield from embedded_engine(loaded_fp32, **VARIANTS[request.param])


def embedded_engine(loaded: LoadedModel, **kwargs) -> Iterator[EmbeddedEngine]:
    """An engine on `loaded` for a fixture's lifetime, closed after it."""
    import asyncio

    engine = EmbeddedEngine(loaded, **kwargs)
    yield engine
    asyncio.run(engine.close())
