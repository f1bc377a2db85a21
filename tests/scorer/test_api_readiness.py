"""The API's scorer choice as its lifespan makes it, seen through /readyz (real model engine)."""

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from app.scorer.heuristic import HeuristicScorer
from loadtest.serverproc import free_port

pytestmark = pytest.mark.slow


def readyz(settings: Settings, engine, scorer=None) -> tuple[int, dict]:
    with TestClient(create_app(settings, engine=engine, scorer=scorer)) as client:
        r = client.get("/readyz")
        return r.status_code, r.json()


def test_an_unreachable_worker_is_reported_but_the_api_stays_ready(engine):
    settings = Settings(scorer_url=f"http://127.0.0.1:{free_port()}")
    assert readyz(settings, engine) == (200, {"ready": True, "engine": True, "scorer": False})


def test_a_scorer_passed_in_wins_over_the_url(engine):
    settings = Settings(scorer_url=f"http://127.0.0.1:{free_port()}")
    assert readyz(settings, engine, HeuristicScorer()) == (200, {"ready": True, "engine": True, "scorer": True})
