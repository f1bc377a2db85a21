"""The readiness monitor logs what changes, not every check."""

from __future__ import annotations

import asyncio
import logging

from egrm.api.readiness import ReadinessMonitor, ReadyState


class Flag:
    def __init__(self, ready: bool) -> None:
        self.is_ready = ready

    async def ready(self) -> bool:
        return self.is_ready


def test_only_changes_are_logged(caplog):
    engine, scorer = Flag(True), Flag(False)
    monitor = ReadinessMonitor(engine, scorer)  # type: ignore[arg-type]

    async def checks() -> list[ReadyState]:
        states = []
        for flip in (False, False, False, True, False, False):
            if flip:
                scorer.is_ready = True
            await monitor.check()
            states.append(monitor.state)
        return states

    with caplog.at_level(logging.INFO, logger="egrm.api.readiness"):
        states = asyncio.run(checks())
    assert states[0] == ReadyState(True, False) and states[-1] == ReadyState(True, True)
    assert [r.getMessage() for r in caplog.records] == [
        "readiness: engine ready, scorer NOT ready",
        "readiness: engine ready, scorer ready",
    ]
