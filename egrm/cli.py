"""The `egrm` command: serve, scorer, fetch-model, eval, score, and the scorer's data and training."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from egrm.config import Settings
from egrm.startup import StartupError, check_model, check_port, load_settings, settings_errors
from egrm.training.judge_examples import Mix


def _share(text: str) -> float:
    """An argparse type: a fraction in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], not {value}")
    return value


def _port(text: str) -> int:
    """An argparse type: a TCP port."""
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 1..65535, not {value}")
    return value


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings({"host": args.host, "port": args.port})
    check_port(settings.host, settings.port, "EGRM_HOST / --host", "EGRM_PORT / --port")
    check_model(settings)

    import uvicorn

    from egrm.api.header_timeout import with_header_deadline
    from egrm.main import create_app

    # On SIGTERM uvicorn stops accepting, lets in-flight requests finish (up to the grace), then
    # the lifespan closes the engine, which runs what is still queued before it stops.
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        http=with_header_deadline(settings.header_timeout_s),
    )
    return 0


def _scorer(args: argparse.Namespace) -> int:
    from egrm.scorer.registry import ScorerLoadError, load_scorer

    settings = load_settings()
    try:
        scorer = load_scorer(args.checkpoint)  # a JSON file: milliseconds, no torch
    except ScorerLoadError as exc:
        print(f"egrm scorer: {exc}", file=sys.stderr)
        return 2
    check_port(args.host, args.port)

    import uvicorn

    from egrm.api.header_timeout import with_header_deadline
    from egrm.worker import create_worker_app

    http = with_header_deadline(settings.header_timeout_s)
    uvicorn.run(create_worker_app(scorer), host=args.host, port=args.port, log_level=args.log_level, http=http)
    return 0


def _fetch_model(args: argparse.Namespace) -> int:
    from egrm.engines.embedded.fetch import DEFAULT_MODEL, SOURCES, fetch_model
    from egrm.factory import judge_model_path

    settings = load_settings()
    source = SOURCES[args.name]
    folder = fetch_model(settings.cache_dir, source)
    # The default: the judge adapter merged in (once). Another model: its folder, as fetched.
    print(judge_model_path(settings) if source is DEFAULT_MODEL else folder)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from egrm.evals.harness import EvalConfig
    from egrm.evals.runner import main as run_eval

    check_model(load_settings())
    config = EvalConfig(
        m=args.m,
        tau=args.tau,
        strategy=args.strategy,
        long_max_tokens=args.long_max_tokens,
        long_accept=args.long_accept,
        long_window=args.long_window,
        load_clients=args.load_clients,
        load_questions=args.load_questions,
        load_group=args.load_group,
        seed=args.seed,
        modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        consensus=args.consensus,
        extra=args.extra,
        policy=_eval_policy(args.policy),
    )
    try:
        return run_eval(args.data, args.split, args.limit, config, args.sweep, args.plot, args.json, args.template)
    except ValueError as exc:
        print(f"egrm eval: {exc}", file=sys.stderr)
        return 2


def _eval_policy(choice: str) -> Any:
    """--policy: the judge's own (as the service loads it), none (route on --tau), or a file."""
    from egrm.factory import routing_policy
    from egrm.pipeline.routing import RoutingPolicy

    if choice == "none":
        return None
    if choice == "auto":
        return routing_policy(load_settings())
    return RoutingPolicy.load(Path(choice))


def _calibrate(args: argparse.Namespace) -> int:
    from egrm.evals.calibration import main as calibrate

    if args.signals is None:
        check_model(load_settings())
    report = calibrate(
        args.data,
        args.split,
        args.limit,
        args.error,
        args.confidence,
        args.extra,
        args.seed,
        args.out,
        signals_in=args.signals,
        signals_out=args.save_signals,
    )
    print(json.dumps(report))
    if report["policy"] is None:
        print("egrm calibrate: no policy keeps the short path's error under the bound: route on tau", file=sys.stderr)
        return 1
    return 0


def _score(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from pydantic import ValidationError

    from egrm.batch import done_ids, local_scorer, read_todo, remote_scorer, run
    from egrm.protocol import RewardOptions

    try:
        options = RewardOptions(m=args.m, tau=args.tau, path=args.path, template=args.template, seed=args.seed)
    except ValidationError as exc:
        print(f"egrm score: bad option: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}", file=sys.stderr)
        return 2
    if args.batch_size < 1 or args.concurrency < 1:
        print("egrm score: --batch-size and --concurrency must be >= 1", file=sys.stderr)
        return 2
    if not args.url:  # the model runs in this process
        check_model(load_settings())
    inp, out = Path(args.input), Path(args.output)
    todo = read_todo(inp, done_ids(out))
    for bad in todo.bad:
        print(f"bad line: {bad}", file=sys.stderr)
    if todo.bad and args.strict:
        print(f"egrm score: {len(todo.bad)} bad line(s) and --strict: nothing scored", file=sys.stderr)
        return 2
    print(f"{len(todo.items)} to score, {todo.done} already in {out}", file=sys.stderr)

    async def main() -> list[str]:
        scoring = remote_scorer(args.url, args.api_key, options) if args.url else local_scorer(options)
        async with scoring as scorer:
            with out.open("a", encoding="utf-8") as sink:
                return await run(todo, sink, scorer, args.batch_size, args.concurrency, not args.quiet)

    failures = asyncio.run(main()) if todo.items else []
    for failure in failures:
        print(f"failed batch: {failure}", file=sys.stderr)
    return 1 if todo.bad or failures else 0


def _make_scorer_data(args: argparse.Namespace) -> int:
    from egrm.training.scorer_data import make_data

    check_model(load_settings())
    counts = make_data(args.out, args.train, args.test, args.long_max_tokens, args.seed)
    print(json.dumps({"out": str(args.out), **counts}))
    return 0


def _train_scorer(args: argparse.Namespace) -> int:
    from egrm.training.loss import HybridLoss
    from egrm.training.scorer_data import read
    from egrm.training.scorer_train import TrainConfig, save_to, train

    config = TrainConfig(epochs=args.epochs, seed=args.seed, loss=HybridLoss(args.a, args.delta, args.margin))
    checkpoint = train(read(args.data), config, progress=True)
    path = save_to(args.out, checkpoint)
    print(json.dumps({"checkpoint": str(path), **{k: v for k, v in checkpoint.meta.items() if k != "config"}}))
    return 0


def _train_grm(args: argparse.Namespace) -> int:
    from egrm.factory import model_path
    from egrm.training.judge_train import GrmTrainConfig, train_grm

    settings = load_settings()
    if not settings.model:
        from egrm.engines.embedded.fetch import fetch_model

        fetch_model(settings.cache_dir)
    config = GrmTrainConfig(
        rank=args.rank,
        alpha=2 * args.rank,
        lr=args.lr,
        batch_size=args.batch_size,
        epochs=args.epochs,
        budget_s=args.budget_min * 60,
        seed=args.seed,
        limit=args.limit,
        threads=settings.threads,
        init=str(args.init) if args.init else None,
        mix=Mix(short_share=args.short_share, wrong_own=args.wrong_own, mixed_share=args.mixed_share),
    )
    meta = train_grm(model_path(settings), args.out, config, progress=not args.quiet)
    print(json.dumps({"adapter": str(args.out), **{k: v for k, v in meta.items() if k != "config"}}))
    return 0


def _eval_scorer(args: argparse.Namespace) -> int:
    from egrm.scorer.model import DEFAULT_CHECKPOINT, Checkpoint
    from egrm.training.scorer_data import read
    from egrm.training.scorer_train import TrainConfig, ablation, evaluate, seeds_spread

    train_items, test_items = read(args.train), read(args.data)
    report = evaluate(Checkpoint.load(args.checkpoint or DEFAULT_CHECKPOINT), train_items, test_items)
    if args.ablation:
        report["ablation"] = ablation(train_items, test_items, TrainConfig())
        report["seeds"] = seeds_spread(train_items, test_items)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
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
    scorer.add_argument("--port", type=_port, default=8001, help="port (default 8001)")
    scorer.add_argument(
        "--checkpoint",
        default="",
        help="trained (the shipped checkpoint, default), heuristic, or a scorer.json / its folder",
    )
    scorer.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    scorer.set_defaults(func=_scorer)
    fetch = sub.add_parser(
        "fetch-model", help="download and convert the default model, merge the judge adapter (idempotent)"
    )
    fetch.add_argument(
        "name",
        nargs="?",
        default="smollm2-135m-instruct",
        choices=["smollm2-135m-instruct", "gemma-3-270m"],
        help="the default judge, or Gemma 3 270M (a base model of another family, no chat template: the tests "
        "serve it with EGRM_CHAT_TEMPLATE=gemma)",
    )
    fetch.set_defaults(func=_fetch_model)
    ev = sub.add_parser("eval", help="accuracy, routing and latency on a labelled set (routed, short, long)")
    ev.add_argument(
        "--data",
        default="builtin:arith",
        help="builtin:arith, builtin:arith-mixed or a JSONL file (see docs/evaluation.md)",
    )
    ev.add_argument(
        "--template",
        choices=["verdict", "pairwise"],
        default="verdict",
        help="pairwise: each builtin item as a right-vs-wrong pair, asked in both orders",
    )
    ev.add_argument("--split", default="test", help="builtin sets: test, train or calibration")
    ev.add_argument("--limit", type=int, help="at most this many items, each difficulty keeping its share")
    ev.add_argument("--m", type=int, default=5, help="answer-only samples per item")
    ev.add_argument("--tau", type=float, default=0.8, help="consensus threshold for the short path")
    ev.add_argument("--strategy", default="ladder", choices=["ladder", "fixed", "nucleus"], help="temperatures")
    ev.add_argument(
        "--modes",
        default="routed,short,long,early",
        help="which of routed,short,long,early to run (long: every candidate to the end; early: with early stop)",
    )
    ev.add_argument("--long-max-tokens", type=int, default=128, help="reasoning tokens per long-path candidate")
    ev.add_argument(
        "--long-accept",
        type=float,
        default=0.9,
        help="early stop: the first --long-window candidates decide when one scores at least this (0: off)",
    )
    ev.add_argument("--long-window", type=int, default=1, help="candidates that reason first under early stop")
    ev.add_argument(
        "--load-clients", type=int, default=16, help="cost under load: clients sending GRPO-shaped groups (0: none)"
    )
    ev.add_argument("--load-questions", type=int, default=48, help="questions (groups) per policy under load")
    ev.add_argument("--load-group", type=int, default=4, help="responses per question under load")
    ev.add_argument(
        "--consensus",
        default="sampled",
        choices=["sampled", "exact"],
        help="the estimator routing uses (both reported)",
    )
    ev.add_argument("--seed", type=int, default=1234)
    ev.add_argument(
        "--policy",
        default="auto",
        help="what routes the routed mode: auto (the judge's calibrated policy, if any, as the service loads it), "
        "none (--tau), or a policy file",
    )
    ev.add_argument("--extra", type=int, default=5, help="adaptive M's extra samples (drawn on every forced short run)")
    ev.add_argument("--sweep", help="m=3,5,7,10 | tau=0.6,0.8,1.0 | strategy=ladder,fixed,nucleus")
    ev.add_argument("--plot", type=Path, help="write a PNG of the results here")
    ev.add_argument("--json", action="store_true", help="print the report as one JSON line on stdout")
    ev.set_defaults(func=_eval)
    data = sub.add_parser("make-scorer-data", help="label the judge's long-path candidates on builtin:arith")
    data.add_argument("--out", type=Path, default=Path("data/scorer"), help="writes train.jsonl and test.jsonl here")
    data.add_argument("--train", type=int, default=100, help="training items (5 candidates each)")
    data.add_argument("--test", type=int, default=60, help="held-out items (from the test split)")
    data.add_argument("--long-max-tokens", type=int, default=128, help="reasoning tokens per candidate (as served)")
    data.add_argument("--seed", type=int, default=7)
    data.set_defaults(func=_make_scorer_data)
    cal = sub.add_parser(
        "calibrate", help="choose the judge's routing policy on labelled items, under a stated short-path error bound"
    )
    cal.add_argument("--data", default="builtin:arith-mixed", help="builtin:arith, builtin:arith-mixed or a JSONL file")
    cal.add_argument(
        "--split", default="calibration", help="builtin sets: calibration (questions neither trained on nor in test)"
    )
    cal.add_argument("--limit", type=int, help="at most this many items, each difficulty keeping its share")
    cal.add_argument("--error", type=float, default=0.03, help="the short path's error the policy must stay under")
    cal.add_argument("--confidence", type=float, default=0.9, help="with this confidence (learn-then-test)")
    cal.add_argument(
        "--extra", type=int, default=5, help="adaptive M's extra samples, for the candidates that use them"
    )
    cal.add_argument("--seed", type=int, default=4321)
    cal.add_argument("--out", type=Path, help="where to write the policy; default: beside the judge")
    cal.add_argument("--save-signals", type=Path, help="also write each item's signals (JSONL), to choose again later")
    cal.add_argument("--signals", type=Path, help="choose on signals saved earlier instead of running the judge")
    cal.set_defaults(func=_calibrate)
    tr = sub.add_parser("train-scorer", help="train the scorer (hybrid loss) on make-scorer-data output")
    tr.add_argument("--data", type=Path, default=Path("data/scorer/train.jsonl"), help="training JSONL")
    tr.add_argument("--out", type=Path, required=True, help="folder for scorer.json (or a .json path)")
    tr.add_argument("--a", type=float, default=0.7, help="weight of the Huber term (the hinge gets 1 - a)")
    tr.add_argument("--delta", type=float, default=1.0, help="Huber delta")
    tr.add_argument("--margin", type=float, default=0.1, help="hinge margin between better and worse")
    tr.add_argument("--epochs", type=int, default=400)
    tr.add_argument("--seed", type=int, default=0)
    tr.set_defaults(func=_train_scorer)
    grm = sub.add_parser(
        "train-grm",
        help="LoRA-tune the model (EGRM_MODEL or default) as a judge on builtin:arith(-mixed) train; writes an adapter",
    )
    grm.add_argument("--out", type=Path, required=True, help="adapter folder (serve it with EGRM_ADAPTER=DIR)")
    grm.add_argument("--budget-min", type=float, default=30.0, help="wall-clock budget; the schedule fits it")
    grm.add_argument("--epochs", type=float, default=1.0, help="passes over the 3,600 training items")
    grm.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 x rank)")
    grm.add_argument("--lr", type=float, default=4e-4)
    grm.add_argument("--batch-size", type=int, default=16)
    grm.add_argument("--seed", type=int, default=0)
    grm.add_argument("--limit", type=int, help="train on the first N items only (smoke runs)")
    grm.add_argument("--init", type=Path, help="continue training this adapter folder (keeps its rank)")
    grm.add_argument("--short-share", type=_share, default=Mix().short_share, help="share of short-path sequences")
    grm.add_argument(
        "--wrong-own",
        type=_share,
        default=Mix().wrong_own,
        help="share of sequences whose own answer is wrong (not learnt)",
    )
    grm.add_argument(
        "--mixed-share",
        type=_share,
        default=Mix().mixed_share,
        help="share of items from builtin:arith-mixed (the rest: builtin:arith)",
    )
    grm.add_argument("--quiet", action="store_true", help="no progress bar")
    grm.set_defaults(func=_train_grm)
    es = sub.add_parser("eval-scorer", help="held-out pairwise accuracy and MAE of a scorer against baselines")
    es.add_argument("--data", type=Path, default=Path("data/scorer/test.jsonl"), help="held-out JSONL")
    es.add_argument("--train", type=Path, default=Path("data/scorer/train.jsonl"), help="fits baseline directions")
    es.add_argument("--checkpoint", type=Path, help="scorer.json to evaluate (default: the shipped one)")
    es.add_argument("--ablation", action="store_true", help="also retrain on each feature group and over 3 seeds")
    es.add_argument("--json", action="store_true", help="one JSON line")
    es.set_defaults(func=_eval_scorer)

    score = sub.add_parser(
        "score",
        help="score a JSONL file of items (prompt, response, ..., id) into OUT.jsonl; resumable",
        description="Lines without an id get 'line-N'. Ids already in OUT are skipped; results are appended. "
        "Bad lines are reported on stderr (exit 1); --strict stops before scoring.",
    )
    score.add_argument("input", help="input JSONL")
    score.add_argument("-o", "--output", required=True, help="output JSONL (appended to; its ids are skipped)")
    score.add_argument("--url", help="a running egrm server; without it, the model runs in this process")
    score.add_argument("--api-key", default=os.environ.get("EGRM_API_KEY"), help="bearer key (default EGRM_API_KEY)")
    score.add_argument("--batch-size", type=int, default=16, help="items per request (default 16)")
    score.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    score.add_argument("--m", type=int, help="samples per item (default EGRM_M)")
    score.add_argument("--tau", type=float, help="consensus threshold (default EGRM_TAU)")
    score.add_argument("--path", default="auto", choices=["auto", "short", "long"])
    score.add_argument("--template", choices=["verdict", "score", "pairwise"])
    score.add_argument("--seed", type=int, help="makes sampling reproducible")
    score.add_argument("--strict", action="store_true", help="stop at bad lines instead of skipping them")
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.set_defaults(func=_score)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: the readiness checks alone (engine and scorer, every 2 s)
    # buried the log. Its failures still reach us as exceptions; the monitor logs what changes.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StartupError as exc:
        lines = list(exc.lines)
    except ValidationError as exc:  # Settings built deeper than the command's own checks
        if exc.title != Settings.__name__:
            raise
        lines = settings_errors(exc)
    for line in lines:
        print(f"egrm: {line}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
