"""The `egrm` command: serve, fetch-model."""

from __future__ import annotations

import argparse
import logging
import sys

from app.config import Settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = Settings(**overrides)
    # On SIGTERM uvicorn stops accepting, lets in-flight requests finish (up to the grace), then
    # the lifespan closes the engine, which runs what is still queued before it stops.
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )
    return 0


def _fetch_model(args: argparse.Namespace) -> int:
    from app.engines.embedded.fetch import fetch_model

    print(fetch_model(Settings().cache_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="egrm", description="Routed generative reward scoring (E-GRM).")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP service (settings from EGRM_* variables)")
    serve.add_argument("--host", help="bind address (default EGRM_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default EGRM_PORT or 8000)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(func=_serve)
    fetch = sub.add_parser("fetch-model", help="download and convert the default model (idempotent)")
    fetch.set_defaults(func=_fetch_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
