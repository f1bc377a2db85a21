"""Start a server, run locust headless against it, write CSV + HTML reports; exit non-zero on any failure."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from loadtest.serverproc import running_server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--spawn-rate", type=float, default=4)
    parser.add_argument("--run-time", default="60s")
    parser.add_argument("--out", type=Path, default=Path("reports"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    locustfile = Path(__file__).with_name("locustfile.py")
    with running_server() as url:
        cmd = [
            sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--host", url,
            "-u", str(args.users), "-r", str(args.spawn_rate), "-t", args.run_time,
            "--csv", str(args.out / "loadtest"), "--html", str(args.out / "loadtest.html"),
            "--exit-code-on-error", "1", "--only-summary", "--stop-timeout", "120",
        ]  # fmt: skip
        return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
