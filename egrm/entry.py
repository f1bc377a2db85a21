"""The `egrm` command. `pip install egrm` alone is the client side (no torch): then the command
says what to install instead of failing on an import."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from egrm.cli import main as cli_main
    except ModuleNotFoundError as exc:
        print(f"egrm: {exc.name} is missing; the service needs: pip install 'egrm[server]'", file=sys.stderr)
        return 2
    return cli_main()
