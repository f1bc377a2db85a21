"""The engine's own tests compare tokens and log-probs across batch shapes, layouts and other
engines exactly: they run in float32, where batched and single-row kernels agree token for token."""

from __future__ import annotations

import pytest

from egrm.engines.embedded.engine import EmbeddedEngine


@pytest.fixture(scope="session")
def engine(exact_engine: EmbeddedEngine) -> EmbeddedEngine:
    return exact_engine
