"""`python -m egrm.cli score` as real subprocesses: in-process, against a server, resumed, killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from egrm.config import Settings
from egrm.main import create_app
from tests.live import serve

pytestmark = pytest.mark.slow

LINES = [
    '{"id": "a", "prompt": "What is 2+2?", "response": "4", "reference": "4"}',
    '{"prompt": "Capital of France?", "response": "Berlin"}',
    "not json",
    '{"id": "c", "response": "x"}',
    "",
    '{"id": 7, "prompt": "What is 3*3?", "response": "9"}',
]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def score(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "egrm.cli", "score", *args, "--quiet"]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def url(engine) -> Iterator[str]:
    with serve(create_app(Settings(), engine=engine)) as base:
        yield base


def test_in_process_run_then_nothing_left(tmp_path, model_path):
    inp, out = write(tmp_path / "in.jsonl", LINES), tmp_path / "out.jsonl"
    env = {"EGRM_MODEL": str(model_path)}
    done = score(str(inp), "-o", str(out), "--path", "short", "--seed", "1", env=env)
    assert done.returncode == 1, done.stderr  # two bad lines, reported, the rest scored
    assert f"{inp}:3:" in done.stderr and f"{inp}:4: prompt: Field required" in done.stderr
    written = rows(out)
    assert [(r["id"], r["line"]) for r in written] == [("a", 1), ("line-2", 2), ("7", 6)]
    assert [r["route"] for r in written] == ["reference", "short", "short"]  # "a" has a reference that decides
    assert all(r["answer"] in ("Yes", "No") for r in written) and written[0]["answer"] == "Yes"
    assert [sum(r["votes"].values()) for r in written] == [0, 5, 5]
    again = score(str(inp), "-o", str(out), env=env)
    assert "0 to score, 3 already in" in again.stderr and rows(out) == written


def test_resume_skips_done_ids_and_cuts_a_torn_line(tmp_path, url):
    inp, out = write(tmp_path / "in.jsonl", LINES), tmp_path / "out.jsonl"
    kept = {"id": "a", "line": 1, "reward": 0.5, "note": "written by an earlier run"}
    out.write_text(json.dumps(kept) + "\n" + '{"id": "line-2", "line": 2, "rew')  # killed mid-write
    done = score(str(inp), "-o", str(out), "--url", url, "--path", "short")
    assert done.returncode == 1 and "2 to score, 1 already in" in done.stderr
    written = rows(out)  # every line parses: the torn one is gone
    assert written[0] == kept and sorted(r["id"] for r in written[1:]) == ["7", "line-2"]


def test_a_killed_run_loses_nothing_and_the_rerun_completes(tmp_path, url):
    items = [json.dumps({"id": f"q{i}", "prompt": f"What is {i}+{i}?", "response": str(2 * i)}) for i in range(6)]
    inp, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "egrm.cli", "score", str(inp), "-o", str(out), "--url", url, "--quiet"]
    proc = subprocess.Popen([*args, "--batch-size", "1", "--concurrency", "1", "--path", "short"])
    try:
        while not (out.exists() and out.read_text().count("\n") >= 1):
            assert proc.poll() is None, "finished before it could be killed"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    first = rows(out)
    assert 1 <= len(first) < 6
    done = score(str(inp), "-o", str(out), "--url", url, "--path", "short")
    assert done.returncode == 0, done.stderr
    ids = [r["id"] for r in rows(out)]
    assert sorted(ids) == [f"q{i}" for i in range(6)] and rows(out)[: len(first)] == first


def test_strict_stops_before_scoring_and_bad_options_are_named(tmp_path, url):
    inp, out = write(tmp_path / "in.jsonl", LINES), tmp_path / "out.jsonl"
    strict = score(str(inp), "-o", str(out), "--url", url, "--strict")
    assert strict.returncode == 2 and "--strict" in strict.stderr and not out.exists()
    bad = score(str(inp), "-o", str(out), "--url", url, "--tau", "3")
    assert bad.returncode == 2 and "tau" in bad.stderr
    dupes = write(tmp_path / "dupes.jsonl", [LINES[0], LINES[0]])
    run = score(str(dupes), "-o", str(out), "--url", url, "--path", "short")
    assert run.returncode == 1 and "duplicate id 'a' (first on line 1)" in run.stderr and len(rows(out)) == 1


def test_in_process_scoring_gives_the_servers_rewards(exact_engine):
    """`egrm score` without --url builds the server's pipeline (egrm.factory: the same scorer, the
    same reading of chat-wrapped items, the same options): the same items and seed, the same rewards."""
    import asyncio

    import httpx

    from egrm.batch import local_scorer
    from egrm.protocol import RewardItem, RewardOptions

    chatml = "<|im_start|>user\nWhat is 7 * 8?<|im_end|>\n<|im_start|>assistant\n"
    items = [
        RewardItem(id="plain", prompt="What is 7 * 8?", response="56"),
        RewardItem(id="wrapped", prompt=chatml, response="The answer is 56.<|im_end|>"),
        RewardItem(id="numeral", prompt="What is 23 + 19?", response="XLII"),  # read by the judge
        RewardItem(id="long", prompt="What is 47 * 6?", response="282"),
    ]
    options = RewardOptions(seed=5)

    async def in_process() -> list[float | None]:
        async with local_scorer(options, Settings(), exact_engine) as score:
            return [r.reward for r in await score(items)]

    local = asyncio.run(in_process())
    with serve(create_app(Settings(), engine=exact_engine)) as url:
        body = {"items": [i.model_dump(exclude_none=True) for i in items], "options": options.model_dump()}
        served = [r["reward"] for r in httpx.post(f"{url}/v1/rewards", json=body, timeout=300).json()["results"]]
    assert local == served and all(r is not None for r in local)
    assert local[0] == local[1]  # the chat-wrapped twin is the same question and the same answer
