"""`pip install egrm` in a bare virtualenv: the client, the veRL reward function and the wire
models install and run with httpx and pydantic alone, importing no torch, against a real server."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from egrm.config import Settings
from egrm.main import create_app
from tests.live import serve

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

CLIENT_SIDE = """
import asyncio, sys
from egrm.client import AsyncEgrmClient, EgrmClient
from egrm.integrations.verl_reward import compute_score, compute_score_async
from egrm.protocol import RewardRequest

URL = sys.argv[1]
items = [{"prompt": "What is 2+2?", "response": "4", "reference": "4"}]
with EgrmClient(URL) as client:
    (sync,) = client.score(items)

async def main():
    async with AsyncEgrmClient(URL) as client:
        (result,) = await client.score(items)
    return result.reward, await compute_score_async("x", "5", "4", {"question": "What is 2+2?"}, url=URL)

(async_reward, wrong) = asyncio.run(main())
right = compute_score("x", "4", "4", {"question": "What is 2+2?"}, url=URL)
RewardRequest.model_validate({"items": items})
heavy = sorted(m for m in ("torch", "transformers", "fastapi", "peft", "uvicorn") if m in sys.modules)
print(sync.reward, async_reward, right, wrong, heavy)
"""


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serve(create_app(Settings(), engine=engine)) as base:
        yield base


def test_the_client_installs_without_torch_and_scores(tmp_path: Path, url: str) -> None:
    source = tmp_path / "egrm"  # a copy: pip builds in the source tree
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(ROOT / "egrm", source / "egrm", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, str(source)], check=True, timeout=600)  # the one documented command
    installed = subprocess.run([str(python), "-m", "pip", "list"], capture_output=True, text=True, check=True).stdout
    assert "httpx" in installed and "pydantic" in installed
    assert not any(name in installed.lower() for name in ("torch", "transformers", "fastapi"))
    ran = subprocess.run(
        [str(python), "-c", textwrap.dedent(CLIENT_SIDE), url], capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["1.0", "1.0", "1.0", "0.0", "[]"]
    # The import name is the project's: nothing named `app` (the name of most FastAPI applications'
    # own package) lands on the user's path.
    collides = subprocess.run([str(python), "-c", "import app"], capture_output=True, text=True)
    assert collides.returncode != 0 and "No module named 'app'" in collides.stderr
    command = subprocess.run([str(venv / "bin" / "egrm"), "serve"], capture_output=True, text=True)
    assert command.returncode == 2 and "pip install 'egrm[server]'" in command.stderr
