"""Failure modes against real server processes: auth, limits, deadlines, disconnects, shutdown."""

import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from loadtest.serverproc import running_server, server_process
from tests.live import metric, wait_for

pytestmark = pytest.mark.slow

SHORT = {"items": [{"prompt": "What is 2+2?", "response": "4"}], "options": {"path": "short"}}
LONG = {"items": [{"prompt": "Why is the sky blue?", "response": "Rayleigh scattering."}], "options": {"path": "long"}}


def _steady(url: str, series: str) -> bool:
    before = metric(url, series)
    time.sleep(0.5)
    return metric(url, series) == before


@pytest.fixture(scope="module")
def guarded_server(model_path):
    env = {"EGRM_MODEL": str(model_path), "EGRM_API_KEYS": "key-one,key-two", "EGRM_MAX_BODY_BYTES": "4096"}
    with running_server(env) as url:
        yield url


def test_api_keys(guarded_server):
    url = guarded_server
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic key-one"}):
        r = httpx.post(f"{url}/v1/rewards", json=SHORT, headers=headers, timeout=30)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"] == {
            "type": "authentication_error",
            "message": "missing or invalid API key: send 'Authorization: Bearer <key>'",
            "param": "Authorization",
        }
    for key in ("key-one", "key-two"):
        r = httpx.post(f"{url}/v1/rewards", json=SHORT, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert r.status_code == 200
    # Health and metrics stay open (EGRM_OPEN_PATHS); docs and everything else need a key.
    assert httpx.get(f"{url}/healthz").status_code == 200 and httpx.get(f"{url}/metrics").status_code == 200
    assert httpx.get(f"{url}/openapi.json").status_code == 401


def test_body_limit_declared_and_chunked(guarded_server):
    url, auth = guarded_server, {"Authorization": "Bearer key-one"}
    big = {"items": [{"prompt": "x" * 5000, "response": "y"}]}
    r = httpx.post(f"{url}/v1/rewards", json=big, headers=auth, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"

    def chunks():  # no Content-Length: the server counts what arrives
        yield b'{"items": [{"prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'", "response": "y"}]}'

    r = httpx.post(f"{url}/v1/rewards", content=chunks(), headers={**auth, "content-type": "application/json"})
    assert r.status_code == 413 and "EGRM_MAX_BODY_BYTES" in r.json()["error"]["message"]
    assert httpx.post(f"{url}/v1/rewards", json=SHORT, headers=auth, timeout=60).status_code == 200


def test_deadline_gives_504_and_the_service_goes_on(base_model_path):
    # A deadline a short request meets with room to spare on a slow CPU (~1 s here in bf16), and a
    # long path it cannot: 16 branches of up to 2,048 reasoning tokens. The untuned model keeps
    # writing (the tuned judge ends its reasoning in a few dozen tokens, well inside any deadline).
    # No grace after the deadline: what is tested here is the deadline itself (test_groups.py tests
    # the work that goes on for a retry).
    env = {
        "EGRM_MODEL": str(base_model_path),
        "EGRM_REQUEST_TIMEOUT_S": "5",
        "EGRM_LONG_MAX_TOKENS": "2048",
        "EGRM_SHARE_GRACE_S": "0",
    }
    with running_server(env) as url:
        r = httpx.post(f"{url}/v1/rewards", json={**LONG, "options": {"path": "long", "m": 16}}, timeout=60)
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
        assert metric(url, 'egrm_cancelled_requests_total{reason="deadline"}') == 1
        # Items that finish in time keep their results: only the late one gets a timeout error.
        decided = {"prompt": "What is 2+2?", "response": "4", "reference": "4"}  # no model call
        batch = {"items": [decided, *LONG["items"]], "options": {"path": "long", "m": 16}}
        r = httpx.post(f"{url}/v1/rewards", json=batch, timeout=60)
        assert r.status_code == 200, r.text
        first, late = r.json()["results"]
        assert first["reward"] == 1.0 and first["error"] is None
        assert (
            late["reward"] is None and late["error"]["type"] == "timeout_error" and late["error"]["param"] == "items[1]"
        )
        assert metric(url, 'egrm_cancelled_requests_total{reason="deadline"}') == 2
        assert httpx.post(f"{url}/v1/rewards", json=SHORT, timeout=60).status_code == 200


def test_a_client_that_disconnects_has_its_work_cancelled(model_path):
    with running_server({"EGRM_MODEL": str(model_path)}) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/rewards", json=LONG, timeout=0.5)  # gives up and closes the socket
        assert wait_for(lambda: metric(url, 'egrm_cancelled_requests_total{reason="disconnect"}') == 1)
        # The long path stopped: its decode steps stop growing long before the 96 reasoning tokens
        # it was asked for (the engine drops an abandoned job at its next step).
        assert wait_for(lambda: metric(url, "egrm_requests_in_flight") == 0, 10)
        assert wait_for(lambda: _steady(url, "egrm_engine_decode_steps_total"), 10)
        assert metric(url, "egrm_engine_decode_steps_total") < 60
        assert httpx.post(f"{url}/v1/rewards", json=SHORT, timeout=60).status_code == 200


def test_shutdown_drains_in_flight_requests(model_path):
    with server_process({"EGRM_MODEL": str(model_path)}) as (url, proc):
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(httpx.post, f"{url}/v1/rewards", json=LONG, timeout=120)
            assert wait_for(lambda: metric(url, "egrm_requests_in_flight") == 1, 30)
            proc.send_signal(signal.SIGTERM)
            r = slow.result()
        assert r.status_code == 200 and r.json()["results"][0]["route"] == "long"
        # uvicorn re-raises the signal once its graceful shutdown is done.
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        host, port = url.removeprefix("http://").split(":")
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2)


def test_fault_in_one_request_gives_500_and_the_next_succeeds(engine, monkeypatch):
    from fastapi.testclient import TestClient

    from egrm.config import Settings
    from egrm.main import create_app

    original = engine.core.runner.run
    calls = {"n": 0}

    def fails_once(chunks):  # the first forward fails, inside a step on the model thread
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated kernel failure")
        return original(chunks)

    monkeypatch.setattr(engine.core.runner, "run", fails_once)
    with TestClient(create_app(Settings(), engine=engine), raise_server_exceptions=False) as c:
        r = c.post("/v1/rewards", json=SHORT)
        assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
        assert c.post("/v1/rewards", json=SHORT).status_code == 200


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and after how long."""
    sock.settimeout(limit_s)
    started, got = time.monotonic(), b""
    while chunk := sock.recv(4096):
        got += chunk
    return got, time.monotonic() - started


def test_slow_clients_are_cut_off_at_the_header_and_body_deadlines(model_path):
    env = {"EGRM_MODEL": str(model_path), "EGRM_HEADER_TIMEOUT_S": "1", "EGRM_BODY_TIMEOUT_S": "1"}
    with running_server(env) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as slow_head:  # a head that never ends
            slow_head.sendall(b"POST /v1/rewards HTTP/1.1\r\nHost: x\r\n")
            got, after = _read_until_closed(slow_head, 10)
        assert got == b"" and after < 5  # closed, with nothing to say
        with socket.create_connection((host, int(port))) as slow_body:  # 10 of 100 declared bytes
            head = (
                b"POST /v1/rewards HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            )
            slow_body.sendall(head + b'{"items": ')
            got, after = _read_until_closed(slow_body, 10)
        assert got.startswith(b"HTTP/1.1 408") and b"EGRM_BODY_TIMEOUT_S" in got and after < 5
        assert httpx.post(f"{url}/v1/rewards", json=SHORT, timeout=60).status_code == 200  # the rest is served
