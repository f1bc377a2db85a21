"""asyncio helpers shared by layers that must not import each other (pipeline, engines)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def gather_or_cancel(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Await all calls, in order; when one fails, cancel the others (nobody would read them),
    wait until they have let go of what they hold, and re-raise."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
