"""The API's scorer choice as its lifespan makes it, seen through /readyz (real model engine)."""

import contextlib
import socket
import threading

import pytest
from fastapi.testclient import TestClient

from egrm.config import Settings
from egrm.main import create_app
from egrm.scorer.heuristic import HeuristicScorer
from loadtest.serverproc import free_port

pytestmark = pytest.mark.slow


def readyz(settings: Settings, engine, scorer=None) -> tuple[int, dict]:
    with TestClient(create_app(settings, engine=engine, scorer=scorer)) as client:
        r = client.get("/readyz")
        return r.status_code, r.json()


def test_an_unreachable_worker_is_reported_but_the_api_stays_ready(engine):
    settings = Settings(scorer_url=f"http://127.0.0.1:{free_port()}")
    assert readyz(settings, engine) == (200, {"ready": True, "engine": True, "scorer": False, "store": "in-process"})


def test_a_scorer_passed_in_wins_over_the_url(engine):
    settings = Settings(scorer_url=f"http://127.0.0.1:{free_port()}")
    ready = {"ready": True, "engine": True, "scorer": True, "store": "in-process"}
    assert readyz(settings, engine, HeuristicScorer()) == (200, ready)


def test_a_scorer_that_never_answers_does_not_hold_readyz(engine):
    """It accepts TCP and says nothing: /readyz answers from the last background check, so the
    scorer is asked on the monitor's clock, not once per probe (asked per probe, each /readyz
    would wait out the check's timeout). Counted in connections, not timed."""
    probes = 8
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        hung.settimeout(0.05)
        held: list[socket.socket] = []  # accepted and never answered
        done = threading.Event()

        def accept() -> None:
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    held.append(hung.accept()[0])

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        settings = Settings(scorer_url=f"http://127.0.0.1:{hung.getsockname()[1]}", scorer_timeout_s=30)
        with TestClient(create_app(settings, engine=engine)) as client:
            answers = [client.get("/readyz") for _ in range(probes)]
        done.set()
        acceptor.join()
        for connection in held:
            connection.close()
    assert all(a.json() == {"ready": True, "engine": True, "scorer": False, "store": "in-process"} for a in answers)
    assert 1 <= len(held) < probes, len(held)  # the check before serving, then one every INTERVAL_S
