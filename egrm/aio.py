"""asyncio helpers shared by layers that must not import each other (pipeline, engines)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

# The message a call cancelled at its deadline gets (CancelledError.args): work shared with other
# calls may go on for a retry after a deadline, not after a caller that went away.
DEADLINE = "deadline"


async def gather_or_cancel(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Await all calls, in order; when one fails, cancel the others (nobody would read them),
    wait until they have let go of what they hold, and re-raise."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        await cancel_all(tasks)
        raise


async def cancel_all(tasks: Sequence[asyncio.Future[T]], reason: str | None = None) -> None:
    """Cancel the tasks and wait until they have let go of what they hold."""
    for task in tasks:
        task.cancel(reason)
    await asyncio.gather(*tasks, return_exceptions=True)


async def within_deadline(calls: Sequence[Awaitable[T]], timeout_s: float, late: Callable[[], T]) -> list[T]:
    """Await all calls, in order, for at most timeout_s: the ones still running then are cancelled
    and answered by late(). A call that fails cancels the others and re-raises, as gather_or_cancel."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        done, pending = await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((t for t in done if t.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
    except BaseException:
        await cancel_all(tasks)
        raise
    await cancel_all(list(pending), DEADLINE)
    return [late() if t in pending else t.result() for t in tasks]
