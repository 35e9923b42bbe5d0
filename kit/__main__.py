"""The kit's serving commands (what `make serve`, `make stop`, `make status` run).

.venv/bin/python -m kit serve --config optimized
.venv/bin/python -m kit status
.venv/bin/python -m kit stop
"""

from __future__ import annotations

import argparse
import sys

from kit.paths import LOGS
from kit.serve_config import ConfigError, ServeConfig
from kit.server import Server, ServerError

RUN_DIR = LOGS


def serve(args: argparse.Namespace) -> int:
    running = Server.from_state(RUN_DIR)
    if running and running.is_running():
        print(f"[serve] TorchServe is already running (pid {running.pid}); `make stop` first to change it")
        return 0
    if args.backend:
        print("[serve] --backend/BACKEND= is deprecated: it names a variant; use --variant/VARIANT=", file=sys.stderr)
    variant = args.variant or args.backend
    overrides = {"variant": variant} if variant else {}
    if args.bind:
        overrides["bind"] = args.bind
    if args.profile_requests:
        overrides["profile_requests"] = args.profile_requests
    if args.itt_ops:
        overrides["itt_ops"] = True
    config = ServeConfig.from_preset(args.config, **overrides)
    server = Server(config, RUN_DIR)
    if config.served_allocator is not config.allocator:
        print(f"[serve] variant {config.variant.name!r} ({config.variant.backend.value}) runs on the default allocator, "
              f"not {config.allocator.value}: a preloaded allocator crashes it")  # fmt: skip
    pid = server.start()
    print(
        f"[serve] started TorchServe (pid {pid}) with preset {args.config!r}: {server.model_store}; logs in {RUN_DIR}"
    )
    try:
        server.wait_ready(args.deadline)
    except (ServerError, KeyboardInterrupt):
        server.stop()
        raise
    print_endpoints(server)
    return 0


def print_endpoints(server: Server) -> None:
    c = server.config
    print(f"[serve] inference  {server.url('inference', '/predictions/<model>')}   models: {', '.join(c.models)}")
    print(f"[serve] management {server.url('management', '/models')}")
    print(f"[serve] metrics    {server.url('metrics', '/metrics')}")
    if c.token_auth_enabled:
        key_file = server.run_dir / "key_file.json"
        print(f"[serve] token auth is ON (bind {c.bind}); keys in {key_file}")
        print(f'  KEY=$(python3 -c \'import json; print(json.load(open("{key_file}"))["inference"]["key"])\')')
    auth = ' -H "Authorization: Bearer $KEY"' if c.token_auth_enabled else ""
    print("[serve] try:")
    print(
        f"  curl{auth} -H 'Content-Type: text/plain' --data 'a great movie' {server.url('inference', '/predictions/bert')}"
    )
    print("  .venv/bin/python -m client predict minilm 'a sentence to embed'")


def stop(args: argparse.Namespace) -> int:
    server = Server.from_state(RUN_DIR)
    if server is None or not server.is_running():
        print("[stop] no TorchServe started by the kit is running")
        if server:
            server.stop()  # clears stale state and any orphaned workers of that group
        return 0
    print(f"[stop] stopping TorchServe (pid {server.pid}) and its workers")
    server.stop()
    print("[stop] stopped")
    return 0


def status(args: argparse.Namespace) -> int:
    server = Server.from_state(RUN_DIR)
    if server is None or not server.is_running():
        print("[status] not running; start it with `make serve`")
        return 1
    c = server.config
    print(
        f"[status] TorchServe pid {server.pid}, variant {c.variant.name}, launcher {c.launcher}, "
        f"allocator {c.served_allocator.value}, workers {c.workers or 'default'} x threads {c.threads or 'default'}"
    )
    print(f"{'model':10} {'worker':8} {'status':10} {'pid':>7} {'allocator':10} {'cpus':8} {'omp':4} {'rss MB':>8}")
    for w in server.workers():
        p = w.process
        cpus = ",".join(map(str, p.cpus)) if p else "-"
        print(
            f"{w.model:10} {w.worker_id:8} {w.status:10} {p.pid if p else '-':>7} {p.allocator if p else '-':10} "
            f"{cpus:8} {p.omp_threads if p else '-':4} {p.rss_mb if p else 0:8.0f}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="start TorchServe and wait until every model is READY")
    serve_parser.add_argument("--config", default="optimized", help="preset name in config/presets or a .yaml path")
    serve_parser.add_argument("--variant", default="", help="override the preset's variant (config/variants/NAME.yaml)")
    serve_parser.add_argument("--backend", default="", help=argparse.SUPPRESS)  # deprecated spelling of --variant
    serve_parser.add_argument("--bind", default="", help="address to bind (non-loopback turns token auth on)")
    serve_parser.add_argument(
        "--profile-requests",
        type=int,
        default=0,
        help="each worker records a profiler trace of its first N requests into logs/profile/",
    )
    serve_parser.add_argument("--itt-ops", action="store_true", help="op-level ITT ranges for VTune (emit_itt)")
    serve_parser.add_argument("--deadline", type=float, default=900, help="seconds to wait for READY workers")
    serve_parser.set_defaults(func=serve)
    commands.add_parser("stop", help="stop the kit's TorchServe and wait for its processes").set_defaults(func=stop)
    commands.add_parser("status", help="workers, the allocator each really loaded, CPU affinity").set_defaults(
        func=status
    )
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ServerError) as error:
        print(f"[{args.command}] ERROR: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
