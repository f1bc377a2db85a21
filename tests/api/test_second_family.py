"""A second model family end to end: Google's Gemma 3 270M, a base model with no chat template,
from its PyPI chunk packages (`make gemma`), served with EGRM_CHAT_TEMPLATE=gemma through the
embedded engine (transformers' forward: not a llama) and through a real llama.cpp llama-server.
Without a template egrm refuses to start, in one line naming the setting."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from egrm.config import Settings
from egrm.engines.chat_templates import gguf_keys, model_has_template
from egrm.engines.embedded.fetch import GEMMA3_270M, fetch_model
from egrm.main import create_app
from loadtest.serverproc import free_port, llama_server
from tests.live import serve

pytestmark = pytest.mark.slow

# A small M and short reasoning: a 270M model on transformers' generic forward is slow.
SETTINGS = {"chat_template": "gemma", "m": 2, "long_max_tokens": 8}
ITEM = {"prompt": "What is 12 + 30?", "response": "42"}
CHATML_QUERY = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def gemma() -> Path:
    return fetch_model(Settings().cache_dir, GEMMA3_270M)  # `make test` fetched it (`make gemma`)


def every_route(url: str) -> None:
    for path in ("short", "long"):
        r = httpx.post(f"{url}/v1/rewards", json={"items": [ITEM], "options": {"path": path}}, timeout=300)
        assert r.status_code == 200, r.text
        (result,) = r.json()["results"]
        assert result["route"] == path and 0.0 <= result["reward"] <= 1.0 and result["error"] is None
    body = {"query": [CHATML_QUERY + "4<|im_end|>"], "prompts": [CHATML_QUERY]}
    r = httpx.post(f"{url}/get_reward", json=body, timeout=300)
    assert r.status_code == 200 and 0.0 <= r.json()["rewards"][0] <= 1.0, r.text
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": "egrm", "messages": messages}, timeout=300)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("Yes", "No"), r.text


def test_the_model_has_no_template_of_its_own(gemma, base_model_path):
    assert not model_has_template(gemma) and not model_has_template(gemma / GEMMA3_270M.gguf_name)
    keys = gguf_keys(gemma / GEMMA3_270M.gguf_name)  # read from the head, values skipped
    assert {"general.architecture", "tokenizer.ggml.tokens"} <= keys and "tokenizer.chat_template" not in keys
    assert model_has_template(base_model_path)  # the default model brings its own


def test_gemma_on_the_embedded_engine(gemma):
    with serve(create_app(Settings(model=str(gemma), **SETTINGS)), ready_timeout_s=120) as url:
        assert httpx.get(f"{url}/readyz").status_code == 200
        every_route(url)


@pytest.fixture(scope="module")
def llama(gemma: Path) -> Iterator[str]:
    port = free_port()
    # --no-repack: repacked Q4_K weights take kernels (AMX) that this sandbox's CPU refuses
    # (SIGILL at the first forward); the plain layout runs everywhere.
    with llama_server(gemma / GEMMA3_270M.gguf_name, Settings().cache_dir, port, slots=2, args=("--no-repack",)):
        yield f"http://127.0.0.1:{port}"


def test_gemma_on_llamacpp(gemma, llama):
    settings = Settings(model=str(gemma), engine="llamacpp", llamacpp_url=llama, **SETTINGS)
    with serve(create_app(settings)) as url:
        every_route(url)


@pytest.mark.parametrize("engine", ["embedded", "llamacpp"])
def test_without_a_chat_template_egrm_refuses_to_start(gemma, engine):
    env = {"EGRM_MODEL": str(gemma), "EGRM_ENGINE": engine, "EGRM_LLAMACPP_URL": "http://127.0.0.1:9"}
    command = [sys.executable, "-m", "egrm.cli", "serve", "--port", str(free_port())]
    done = subprocess.run(command, env={**_env(), **env}, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.startswith("egrm:")]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "no chat template" in lines[0] and "EGRM_CHAT_TEMPLATE" in lines[0]
    bad = {**env, "EGRM_CHAT_TEMPLATE": "no-such-template"}
    done = subprocess.run(command, env={**_env(), **bad}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "EGRM_CHAT_TEMPLATE='no-such-template'" in done.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("EGRM_")}
