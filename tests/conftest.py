"""Shared fixtures: the real default model, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import Settings
from app.engines.embedded.engine import EmbeddedEngine
from app.engines.embedded.fetch import fetch_model


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The converted default model (fetched by `make test` first; idempotent here)."""
    return fetch_model(Settings().cache_dir)


@pytest.fixture(scope="session")
def engine(model_path: Path) -> EmbeddedEngine:
    """fp32: batched and single-row kernels agree token for token only in fp32."""
    return EmbeddedEngine.load(str(model_path), dtype="float32")
