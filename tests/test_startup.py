"""The real `egrm` command refusing to start: one line naming the setting, exit 2, before any model load."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.serverproc import free_port

EGRM = str(Path(sys.executable).parent / "egrm")
LOADING = "egrm.factory: loading"  # the log line of a model load


def egrm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `egrm ARGS` on the default settings plus env (no EGRM_* of the caller's leaks in)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EGRM_")}
    return subprocess.run([EGRM, *args], env={**base, **(env or {})}, capture_output=True, text=True, timeout=60)


def refused(done: subprocess.CompletedProcess) -> list[str]:
    """The stderr lines of a command that refused to start, checked for the shape every refusal has."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and LOADING not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("egrm: ") for line in lines), done.stderr
    return lines


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another server listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("command", [["serve"], ["scorer"], ["fetch-model"], ["eval"], ["score", "in", "-o", "out"]])
def test_a_bad_engine_is_one_line_naming_the_variable(command):
    lines = refused(egrm(*command, env={"EGRM_ENGINE": "bogus"}))
    assert len(lines) == 1
    assert lines[0].startswith("egrm: EGRM_ENGINE='bogus' is not valid: Input should be 'embedded', 'sglang'")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", "egrm: EGRM_PORT='abc' is not valid: Input should be a valid integer"),
        ("70000", "egrm: EGRM_PORT='70000' is not valid: Input should be less than or equal to 65535"),
    ],
)
def test_a_bad_port_variable(value, message):
    assert refused(egrm("serve", env={"EGRM_PORT": value}))[0].startswith(message)


def test_a_bad_port_flag_is_named_as_the_flag():
    lines = refused(egrm("serve", "--port", "70000"))
    assert lines == ["egrm: --port=70000 is not valid: Input should be less than or equal to 65535"]


def test_every_bad_setting_gets_its_line():
    lines = refused(egrm("serve", env={"EGRM_ENGINE": "bogus", "EGRM_M": "99", "EGRM_TAU": "x"}))
    assert [line.split("=")[0] for line in lines] == ["egrm: EGRM_ENGINE", "egrm: EGRM_M", "egrm: EGRM_TAU"]


def test_a_model_path_that_does_not_exist(tmp_path):
    missing = tmp_path / "no-such-model"
    assert refused(egrm("serve", env={"EGRM_MODEL": str(missing)})) == [f"egrm: EGRM_MODEL='{missing}' does not exist"]


def test_a_cross_field_check_is_one_line():
    lines = refused(egrm("serve", env={"EGRM_ENGINE": "openai"}))
    assert lines == ["egrm: EGRM_OPENAI_URL is required with EGRM_ENGINE=openai (e.g. http://127.0.0.1:8000/v1)"]


def test_a_key_that_does_not_parse_is_not_echoed():
    (line,) = refused(egrm("serve", env={"EGRM_API_KEYS": '["secret-key", '}))
    assert line.startswith("egrm: EGRM_API_KEYS is not valid:") and "secret-key" not in line


@pytest.mark.parametrize(("command", "named"), [("serve", "(EGRM_PORT / --port)"), ("scorer", "(--port)")])
def test_a_port_in_use_is_found_before_the_model_loads(busy_port, command, named):
    done = egrm(command, "--port", str(busy_port))  # refused() holds it to no model load (its log line)
    assert refused(done) == [f"egrm: port {busy_port} on 127.0.0.1 is in use {named}"]


@pytest.mark.parametrize("command", [["serve"], ["eval"], ["score", "in.jsonl", "-o", "out.jsonl"]])
def test_a_default_model_not_fetched_says_how_to_fetch_it(tmp_path, command):
    if command == ["serve"]:
        command = ["serve", "--port", str(free_port())]  # port 8000 may be taken by a server on this machine
    (line,) = refused(egrm(*command, env={"EGRM_CACHE_DIR": str(tmp_path)}))
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert line.startswith(
        f"egrm: the default model is not fetched (no {folder}); run: egrm fetch-model (or make model)"
    )
    assert "about 93 MB to download" in line


def test_a_gpu_asked_for_where_there_is_none_is_one_line():
    """No GPU visible (the GPU path itself is checked by deploy/gpu-check.sh on a machine with one)."""
    env = {"EGRM_DEVICE": "cuda", "CUDA_VISIBLE_DEVICES": ""}
    (line,) = refused(egrm("serve", "--port", str(free_port()), env=env))
    assert line.startswith("egrm: EGRM_DEVICE=cuda but torch sees no CUDA device") and "unset it" in line


def test_a_routing_policy_that_does_not_load_is_one_line(tmp_path):
    bad = tmp_path / "policy.json"
    bad.write_text('{"name": "x"}')
    (line,) = refused(egrm("serve", "--port", str(free_port()), env={"EGRM_ROUTING_POLICY": str(bad)}))
    assert line.startswith("egrm: EGRM_ROUTING_POLICY: ") and "not a routing policy" in line
