"""Read one series from a Prometheus text page (what a scraper sees)."""

from __future__ import annotations

import httpx


def metric(url: str, series: str) -> float:
    """The value of `series` (name plus labels exactly as exposed) at url/metrics; 0 when absent."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0
