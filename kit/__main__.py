"""The kit's serving commands (what `make serve`, `make stop`, `make status` run).

.venv/bin/python -m kit serve --config optimized
.venv/bin/python -m kit status
.venv/bin/python -m kit stop
.venv/bin/python -m kit topology [--json]                  # what this process may use
.venv/bin/python -m kit plan [--models resnet50,bert=2] [--objective latency] [--json]
.venv/bin/python -m kit plan --lscpu host.txt --cpus 8-15 --quota 4.5 --json   # another machine
.venv/bin/python -m kit topology --lscpu host.txt --cpus 0-15 --memory 6Gi   # a 16-CPU / 6 GiB container
.venv/bin/python -m kit plan --lscpu host.txt --cpus 0-15 --memory 6Gi --footprint mine=1.3Gi --models mine --json
python -m kit run --config container --key-file KEYFILE    # the container's PID 1 (kit/supervise.py)
python -m kit probe ready|live                             # its Kubernetes probes (kit/probe.py)
.venv/bin/python -m kit itt-trace                           # after `make serve ITT_TRACE=1`: logs/itt/trace.json

One module, because it is only the command line: each command parses its options and calls
the module that does the work (kit/server.py, kit/plan.py, kit/topology.py, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
from pathlib import Path

from kit import openai_router, probe, supervise
from kit.footprint import Footprint, measure_live
from kit.hints import print_endpoints
from kit.itt import chrome_trace, read_ranges
from kit.layout import Demand, Objective, PlanError
from kit.models import model_names
from kit.paths import LOGS
from kit.plan import plan_layout
from kit.ports import INFERENCE_PORT, METRICS_PORT
from kit.procinfo import process_alive
from kit.proxy import AuthProxy
from kit.serve_config import ConfigError, Placement, ServeConfig
from kit.server import START_DEADLINE_S, Server, ServerError
from kit.topology import (
    Memory,
    Topology,
    TopologyError,
    format_cpus,
    parse_cpus,
    parse_size,
    parse_topology,
    read_topology,
)

RUN_DIR = LOGS
ITT_DIR = LOGS / "itt"


def config_of(args: argparse.Namespace) -> ServeConfig:
    """The preset named by --config, with the command line's overrides."""
    if args.backend:
        print("[serve] --backend/BACKEND= is deprecated: it names a variant; use --variant/VARIANT=", file=sys.stderr)
    variant = args.variant or args.backend
    overrides = {"variant": variant} if variant else {}
    if args.models:
        overrides["models"] = tuple(args.models.split(","))
    if args.bind:
        overrides["bind"] = args.bind
    switches = {"profile_requests": args.profile_requests, "itt_ops": args.itt_ops}
    if any(switches.values()):
        overrides["diagnostics"] = {name: value for name, value in switches.items() if value}
    if args.itt_trace:
        overrides["itt_trace_dir"] = str(ITT_DIR)
    if args.memory:
        overrides["memory"] = args.memory
    return ServeConfig.from_preset(args.config, **overrides)


def serve(args: argparse.Namespace) -> int:
    running = Server.from_state(RUN_DIR)
    if running and running.is_running():
        print(f"[serve] TorchServe is already running (pid {running.pid}); `make stop` first to change it")
        return 0
    config = config_of(args)
    if config.itt_trace_dir:
        shutil.rmtree(config.itt_trace_dir, ignore_errors=True)  # an earlier server's records
    server = Server(config, RUN_DIR)
    if config.cpus and config.placement is Placement.LAUNCHER:
        print(
            f"[serve] placement launcher pins workers from the host's lscpu: cpus {config.cpus!r} binds the "
            "frontend only; placement plan keeps the workers there too"
        )
    for model in config.models:
        variant = config.variant_of(model)
        if config.allocator_of(model) is not config.allocator:
            print(
                f"[serve] {model}: variant {variant.name!r} ({variant.backend.value}) runs on the default allocator, "
                f"not {config.allocator.value}: a preloaded allocator crashes it"
            )
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


def run(args: argparse.Namespace) -> int:
    proxy = AuthProxy(Path(args.key_file), *args.proxy_ports) if args.key_file else None
    return supervise.run(Server(config_of(args), RUN_DIR), proxy, args.drain, args.deadline)


def probe_server(args: argparse.Namespace) -> int:
    reason = probe.PROBES[args.probe](RUN_DIR)
    print(reason or f"{args.probe}: ok")
    return 1 if reason else 0


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
    layout = f"{c.objective.value} plan" if server.layout else f"{c.workers or 'default'} x {c.threads or 'default'}"
    variants = ", ".join(f"{model} {c.variant_of(model).name}" for model in c.models)
    print(f"[status] TorchServe pid {server.pid}, variants: {variants}; placement {c.placement.value} ({layout})")
    print(f"[status] {read_topology().summary()[0]}")  # the ISA the workers' kernels use
    if server.router_pid:
        log = server.run_dir / openai_router.LOG_FILE
        alive = "running" if process_alive(server.router_pid) else f"EXITED (see {log})"
        print(f"[status] OpenAI router pid {server.router_pid} at {server.api.openai_url('/v1')}: {alive}")
    # RSS counts pages shared with sibling workers in full, PSS divides them among the processes
    # that map them, "own" is what the worker alone holds (what one more worker would add).
    print(
        f"{'model':10} {'worker':7} {'status':9} {'pid':>7} {'allocator':9} {'cpus':10} {'memory':10} {'omp':>3} "
        f"{'rss MB':>7} {'pss MB':>7} {'own MB':>7}"
    )
    workers = server.api.workers()
    for w in workers:
        p = w.process
        footprint = measure_live(p.pid) if p else None
        memory = (
            f"{footprint.rss / 2**20:7.0f} {footprint.pss / 2**20:7.0f} {footprint.private / 2**20:7.0f}"
            if footprint
            else f"{'-':>7} {'-':>7} {'-':>7}"
        )
        print(
            f"{w.model:10} {w.worker_id:7} {w.status:9} {p.pid if p else '-':>7} {p.allocator if p else '-':9} "
            f"{format_cpus(p.cpus) if p else '-':10} {p.memory_policy if p else '-':10} "
            f"{p.omp_threads if p else '-':>3} {memory}"
        )
    if server.layout:
        print(f"[status] planned {server.layout.summary()[-1]}")
    pinned = {cpu for w in workers if w.process for cpu in w.process.cpus}
    idle = c.allowed_cpus - pinned
    frontend = server.launch.frontend_cpus()
    print(
        f"[status] frontend CPUs: {format_cpus(frontend) if frontend else 'all'}; "
        f"CPUs no worker runs on: {format_cpus(idle) if idle else 'none'}"
    )
    if oom := server.oom.note():
        print(f"[status] WARNING: {oom}")
    for title, lines in server.numbers():
        print(f"[status] {title}:")
        print("\n".join(lines))
    return 0


def topology_of(args: argparse.Namespace) -> Topology:
    """This process's topology, or the one described by --lscpu/--cpus/--quota/--memory."""
    if not args.lscpu and (args.cpus or args.quota):
        raise TopologyError("--cpus and --quota describe another machine: give its --lscpu file too")
    if args.lscpu:
        text = Path(args.lscpu).read_text()
        machine = parse_topology(text, parse_cpus(args.cpus) if args.cpus else None, args.quota)
    else:
        machine = read_topology()
    if not args.memory:
        return machine
    size = parse_size(args.memory)  # what a container or pod may hold: its limit
    return dataclasses.replace(machine, memory=Memory(size, size, limit=size))


def demands_of(args: argparse.Namespace) -> list[Demand]:
    """The models to plan, each with its footprint: given by --footprint, else the one recorded for
    --variant's archive at the optimized preset's batch size (None: never measured)."""
    given = {}
    for item in filter(None, args.footprint.split(",")):
        model, _, size = item.partition("=")
        given[model.strip()] = Footprint.of_size(parse_size(size))
    # The optimized preset's variant unless --variant, and its batch size.
    preset = ServeConfig.from_preset("optimized", **({"variant": args.variant} if args.variant else {}))
    demands = [Demand.parse(text) for text in args.models.split(",")]
    strangers = sorted(set(given) - {d.model for d in demands})
    if strangers:
        raise PlanError(f"--footprint names {strangers}, which --models does not plan")
    planned = []
    for d in demands:
        demand = dataclasses.replace(preset.demand(d.model), share=d.share)
        if d.model in given:  # a language model's given size holds its archive's sequences
            sequences = demand.sequences.most if demand.sequences else 0
            demand = dataclasses.replace(demand, footprint=dataclasses.replace(given[d.model], sequences=sequences))
        planned.append(demand)
    return planned


def topology(args: argparse.Namespace) -> int:
    machine = topology_of(args)
    print(json.dumps(machine.to_dict(), indent=2) if args.json else "\n".join(machine.summary()))
    return 0


def plan(args: argparse.Namespace) -> int:
    topology = topology_of(args)
    layout = plan_layout(topology, demands_of(args), args.objective)
    # The CPU line names the ISA the workers' kernels get (and whether bf16 variants may serve).
    print(
        json.dumps(layout.to_dict(), indent=2) if args.json else "\n".join([topology.summary()[0], *layout.summary()])
    )
    return 0


def add_server_options(parser: argparse.ArgumentParser, preset: str) -> None:
    parser.add_argument("--config", default=preset, help="preset name in config/presets or a .yaml path")
    parser.add_argument("--variant", default="", help="override the preset's variant (config/variants/NAME.yaml)")
    parser.add_argument("--backend", default="", help=argparse.SUPPRESS)  # deprecated spelling of --variant
    parser.add_argument("--models", default="", help="serve only these models (comma list)")
    parser.add_argument(
        "--profile-requests",
        type=int,
        default=0,
        help="each worker records a profiler trace of its first N requests into logs/profile/",
    )
    parser.add_argument("--itt-ops", action="store_true", help="op-level ITT ranges for VTune (emit_itt)")
    parser.add_argument(
        "--itt-trace", action="store_true", help=f"record every worker's ITT ranges into {ITT_DIR} (kit/itt.py)"
    )
    parser.add_argument(
        "--memory", default="", help="serve within this much memory (e.g. 6Gi): the plan fits the workers into it"
    )
    parser.add_argument("--deadline", type=float, default=START_DEADLINE_S, help="seconds to wait for READY workers")


def add_machine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lscpu", default="", help="`lscpu -p=CPU,CORE,SOCKET,NODE,CACHE` of another machine")
    parser.add_argument("--cpus", default="", help="with --lscpu: the allowed CPUs (a cpuset, e.g. 8-15)")
    parser.add_argument("--quota", type=float, default=None, help="with --lscpu: the CPU quota in CPUs (e.g. 4.5)")
    parser.add_argument("--memory", default="", help="the memory limit (e.g. 8Gi, 6GiB): a pod's, or a budget here")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def itt_trace(args: argparse.Namespace) -> int:
    ranges = read_ranges(args.dir)
    if not ranges:
        print(f"[itt-trace] no ranges in {args.dir}: serve with `make serve ITT_TRACE=1` and send requests first")
        return 1
    out = args.out or args.dir / "trace.json"
    out.write_text(json.dumps(chrome_trace(ranges)))
    for name in sorted({r.name for r in ranges}):
        ms = [(r.end_ns - r.begin_ns) / 1e6 for r in ranges if r.name == name]
        print(f"[itt-trace] {name}: {len(ms)} ranges, median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms")
    print(f"[itt-trace] {out}: open it in ui.perfetto.dev or chrome://tracing")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="start TorchServe and wait until every model is READY")
    add_server_options(serve_parser, "optimized")
    serve_parser.add_argument("--bind", default="", help="address to bind (non-loopback turns token auth on)")
    serve_parser.set_defaults(func=serve)
    run_parser = commands.add_parser("run", help="the container's PID 1: serve in the foreground, drain on SIGTERM")
    add_server_options(run_parser, "container")
    run_parser.set_defaults(bind="")
    run_parser.add_argument(
        "--key-file", default="", help="API key file (a mounted Secret): publish through the auth proxy"
    )
    run_parser.add_argument(
        "--proxy-ports",
        type=int,
        nargs=2,
        default=(INFERENCE_PORT, METRICS_PORT),
        metavar=("INFERENCE", "METRICS"),
        help="ports the auth proxy publishes",
    )
    run_parser.add_argument(
        "--drain", type=float, default=supervise.DRAIN_S, help="seconds served after SIGTERM before stopping"
    )
    run_parser.set_defaults(func=run)
    probe_parser = commands.add_parser("probe", help="Kubernetes exec probes: exit 0 when ready / live")
    probe_parser.add_argument("probe", choices=sorted(probe.PROBES))
    probe_parser.set_defaults(func=probe_server)
    commands.add_parser("stop", help="stop the kit's TorchServe and wait for its processes").set_defaults(func=stop)
    commands.add_parser("status", help="workers, the allocator each really loaded, CPU affinity").set_defaults(
        func=status
    )
    topology_parser = commands.add_parser("topology", help="CPUs, cores, NUMA nodes, L3 domains, quota, ISA")
    add_machine_options(topology_parser)
    topology_parser.set_defaults(func=topology)
    plan_parser = commands.add_parser("plan", help="the serving layout planned for this (or another) machine")
    add_machine_options(plan_parser)
    plan_parser.add_argument(
        "--models",
        default=",".join(model_names()),
        help="comma list, each with an optional traffic share: resnet50,bert=2",
    )
    plan_parser.add_argument("--objective", type=Objective, default=Objective.THROUGHPUT, choices=list(Objective))
    plan_parser.add_argument(
        "--variant", default="", help="whose recorded footprints to plan with (default: the optimized preset's)"
    )
    plan_parser.add_argument(
        "--footprint", default="", help="memory per worker, for models not measured here: bert=1.3Gi,resnet50=700Mi"
    )
    plan_parser.set_defaults(func=plan)
    trace_parser = commands.add_parser("itt-trace", help="the ITT ranges recorded by --itt-trace as a Perfetto trace")
    trace_parser.add_argument("--dir", type=Path, default=ITT_DIR, help="where the workers recorded")
    trace_parser.add_argument("--out", type=Path, default=None, help="trace file (default: DIR/trace.json)")
    trace_parser.set_defaults(func=itt_trace)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ServerError, TopologyError, PlanError) as error:
        print(f"[{args.command}] ERROR: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
