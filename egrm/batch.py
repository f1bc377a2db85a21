"""`egrm score IN.jsonl -o OUT.jsonl`: score a JSONL file, resumably, on a server or in-process.

Each input line is a reward item (prompt, response, optional response_b, reference) plus an `id`;
a line without one gets the id "line-N" (its 1-based line number), stable across runs of the same
file. Ids already in OUT are skipped and new results are appended, one flushed line per item, so a
run killed midway loses nothing it wrote (a torn last line is cut off on the next run).
A bad line is reported on stderr with its number and left out (exit status 1 at the end);
--strict stops before any scoring instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError
from tqdm import tqdm

from egrm.config import Settings
from egrm.engines.base import Engine
from egrm.protocol import RewardItem, RewardOptions, RewardResult

# What scores one batch of items: a server over HTTP, or the pipeline in this process.
ScoreBatch = Callable[[Sequence[RewardItem]], Awaitable[list[RewardResult]]]


@dataclass(slots=True)
class Todo:
    items: list[RewardItem] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # id -> input line number
    bad: list[str] = field(default_factory=list)  # "IN:N: why"
    done: int = 0  # ids already in OUT


def done_ids(out: Path) -> set[str]:
    """Ids with a complete line in OUT; a torn last line (the writer was killed) is cut off."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) != len(data):
        with out.open("r+b") as f:
            f.truncate(len(complete))
    ids = set()
    for line in complete.decode("utf-8").splitlines():
        if line.strip():
            ids.add(str(json.loads(line)["id"]))
    return ids


def read_todo(path: Path, skip: set[str]) -> Todo:
    todo = Todo()
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("a line must be a JSON object")
                row["id"] = str(row["id"]) if row.get("id") is not None else f"line-{n}"
                item = RewardItem.model_validate(row)
            except (ValueError, ValidationError) as exc:
                todo.bad.append(f"{path}:{n}: {_why(exc)}")
                continue
            assert item.id is not None  # set above
            if item.id in seen:
                todo.bad.append(f"{path}:{n}: duplicate id {item.id!r} (first on line {todo.lines.get(item.id)})")
                continue
            seen.add(item.id)
            if item.id in skip:
                todo.done += 1
                continue
            todo.items.append(item)
            todo.lines[item.id] = n
    return todo


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in exc.errors()[:3])
    return str(exc)


async def run(
    todo: Todo, out: TextIO, scorer: ScoreBatch, batch_size: int, concurrency: int, progress: bool = True
) -> list[str]:
    """Score todo.items in batches, `concurrency` at once; append each batch as it finishes.

    Returns the failures of whole batches (server refusals), by input line; their items are not
    written, so the next run tries them again.
    """
    gate = asyncio.Semaphore(concurrency)
    failures: list[str] = []
    batches = [todo.items[i : i + batch_size] for i in range(0, len(todo.items), batch_size)]
    with tqdm(total=len(todo.items), unit="item", disable=not progress, file=sys.stderr) as bar:

        async def one(batch: list[RewardItem]) -> None:
            async with gate:
                try:
                    results = await scorer(batch)
                except Exception as exc:  # reported per batch; the run goes on
                    lines = ", ".join(str(todo.lines[i.id or ""]) for i in batch)
                    failures.append(f"lines {lines}: {exc}")
                    bar.update(len(batch))
                    return
            for item, result in zip(batch, results, strict=True):
                out.write(json.dumps(_row(todo.lines[item.id or ""], result), ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
            bar.update(len(batch))

        await asyncio.gather(*(one(b) for b in batches))
    return failures


def _row(line: int, result: RewardResult) -> dict[str, Any]:
    row = result.model_dump(exclude={"index"}, exclude_none=True)
    return {"id": result.id, "line": line, **{k: v for k, v in row.items() if k != "id"}}


@asynccontextmanager
async def remote_scorer(url: str, api_key: str | None, options: RewardOptions) -> AsyncIterator[ScoreBatch]:
    from egrm.client import AsyncEgrmClient

    # Batching and concurrency are the runner's; the client sends each batch as one request.
    async with AsyncEgrmClient(url, api_key=api_key, batch_size=10**9, concurrency=1) as client:

        async def score(items: Sequence[RewardItem]) -> list[RewardResult]:
            return await client.score(items, options)

        yield score


@asynccontextmanager
async def local_scorer(
    options: RewardOptions, settings: Settings | None = None, engine: Engine | None = None
) -> AsyncIterator[ScoreBatch]:
    """The server's pipeline in this process (factory.py, EGRM_* settings: the same scorer, the
    same reading of items, the same options), so a file gets the rewards a server would give it."""
    from egrm.api.items import judge_item
    from egrm.api.rewards import to_wire
    from egrm.api.scoring import resolve_options
    from egrm.factory import pipeline_from

    settings = settings or Settings()
    async with pipeline_from(settings, engine) as pipeline:
        judge_options = resolve_options(options, settings, pipeline.policy)

        async def score(items: Sequence[RewardItem]) -> list[RewardResult]:
            judged = [judge_item(i) for i in items]
            # No prompt-token limit here: an item too long for the model gets its own error line.
            results = await pipeline.score(judged, judge_options)
            return [to_wire(n, item, r) for n, (item, r) in enumerate(zip(judged, results, strict=True))]

        yield score
