"""The `egrm` command: serve, scorer, fetch-model."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

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


def _scorer(args: argparse.Namespace) -> int:
    import uvicorn

    from app.scorer.registry import ScorerLoadError, load_scorer
    from app.scorer.worker import create_worker_app

    try:
        scorer = load_scorer(args.checkpoint)
    except ScorerLoadError as exc:
        print(f"egrm scorer: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(create_worker_app(scorer), host=args.host, port=args.port, log_level=args.log_level)
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
    scorer = sub.add_parser("scorer", help="run the scorer worker (the API reaches it by EGRM_SCORER_URL)")
    scorer.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    scorer.add_argument("--port", type=int, default=8001, help="port (default 8001)")
    scorer.add_argument("--checkpoint", type=Path, help="trained scorer folder; default: the heuristic scorer")
    scorer.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    scorer.set_defaults(func=_scorer)
    fetch = sub.add_parser("fetch-model", help="download and convert the default model (idempotent)")
    fetch.set_defaults(func=_fetch_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
