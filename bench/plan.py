"""A benchmark plan: which serving configurations to compare, as data.

    plan = load_plan("default")          # bench/plans/default.yaml, or a path to your own .yaml

A plan file has run settings and a list of rows. A row names a preset (config/presets) and
overrides any ServeConfig field; a list value expands into one row per value (a matrix):

    seconds: 20
    models: [resnet50, bert]
    rows:
      - {name: baseline, preset: baseline, baseline: true}
      - {name: inductor, preset: optimized, allocator: [jemalloc, tcmalloc]}
      - {name: phone photos, preset: optimized, models: [resnet50], payload: [vga, phone]}
    peers:                                  # optional: the same models in other runtimes, in-process
      - {runtime: openvino, precision: int8}
    served_peers:                           # optional: other servers on the kit's IR, under the same ab
      - {framework: litserve, precision: int8, batch_size: 4, concurrency: 8}

`threads: up-to-l3` expands into 2, 4, ... cores per worker up to this machine's largest L3
domain (what `make tune` searches; kit/plan.py thread_counts).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
from pathlib import Path
from typing import Any

import yaml

from bench.payloads import PAYLOADS, default_payload
from handlers.backends import DType
from handlers.typed_config import SettingsError, parse_settings
from kit.models import Model, check_models, model_names
from kit.plan import thread_counts
from kit.serve_config import ServeConfig
from kit.topology import Topology, read_topology

PLANS = Path(__file__).resolve().parent / "plans"
EAGER_VARIANT = "eager"  # peers run the weights of the eager archive: the same function as every row
ROW_KEYS = {"name", "preset", "baseline", "models", "concurrency", "payload", "itt"}
SERVE_KEYS = {f.name for f in dataclasses.fields(ServeConfig)} - {"models"}
THREADS_UP_TO_L3 = "up-to-l3"
PORT_KEYS = {"bind", "management_bind", "worker_port"} | {
    f.name for f in dataclasses.fields(ServeConfig) if f.name.endswith("_port")
}


class PlanError(SettingsError):
    """The plan file is wrong; the message names the row and the key."""


class Runtime(enum.StrEnum):
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"


class Framework(enum.StrEnum):
    """The servers a user would write instead (bench/versus/apps.py; declared here, where plans
    name them, so reading a plan imports neither torch nor LitServe)."""

    FASTAPI = "fastapi"
    LITSERVE = "litserve"


@dataclasses.dataclass(frozen=True)
class Peer:
    """The same model in a runtime a user could pick instead of the kit (bench/versus/runtimes.py runs it)."""

    runtime: Runtime
    precision: DType = DType.FLOAT32
    batch_size: int = 1

    @property
    def name(self) -> str:
        return f"{self.runtime.value} {self.precision.value} b{self.batch_size}"


# A served peer runs the IR of the kit's own OpenVINO archive of its precision.
SERVED_PEER_VARIANT = {DType.FLOAT32: "openvino", DType.BFLOAT16: "openvino-bf16", DType.INT8: "openvino-int8"}


@dataclasses.dataclass(frozen=True)
class ServedPeer:
    """A server a user would write instead of TorchServe (bench/versus/apps.py), on the kit's IR."""

    framework: Framework
    precision: DType = DType.FLOAT32
    batch_size: int = 1  # litserve: max_batch_size (dynamic batching); fastapi: 1
    concurrency: int | None = None  # ab -c; None = the plan's
    payload: str | None = None  # what ab sends (bench/payloads.py); None = each model's default

    def __post_init__(self) -> None:
        if self.precision not in SERVED_PEER_VARIANT:
            raise PlanError(f"served peers run {sorted(SERVED_PEER_VARIANT)}, not {self.precision}")
        if self.framework is Framework.FASTAPI and self.batch_size != 1:
            raise PlanError("the fastapi peer has no dynamic batching: batch_size must be 1")

    @property
    def name(self) -> str:
        return f"{self.framework.value} openvino {self.precision.value} b{self.batch_size}"

    @property
    def variant(self) -> str:
        return SERVED_PEER_VARIANT[self.precision]


@dataclasses.dataclass(frozen=True)
class RunSettings:
    seconds: int = 20  # ab time limit per row
    concurrency: int = 4  # ab -c unless a row sets its own
    warmup_requests: int = 16  # sent and discarded before measuring
    # Then this long of the row's load, discarded too: a steady server (the JVM's JIT done), not a fresh one.
    warmup_seconds: int = 0
    in_process: bool = True  # also measure the same model without a server
    in_process_seconds: int = 10
    start_deadline_s: int = 1800  # cold max-autotune compiles take minutes
    # Served rows record their workers' ITT ranges with the kit's collector (kit/itt.py): two
    # write(2)s per inference call (PLAN=versus measures its cost); a row's `itt` overrides it.
    itt: bool = True
    # Interleaved rounds (bench/versus/rounds.py): each row and served peer once per round, medians reported.
    rounds: int = 1
    models: tuple[str, ...] = dataclasses.field(default_factory=lambda: tuple(model_names()))
    description: str = ""

    def __post_init__(self) -> None:
        if min(self.seconds, self.concurrency, self.rounds) < 1 or min(self.warmup_requests, self.warmup_seconds) < 0:
            raise PlanError(f"need seconds, concurrency, rounds >= 1 and warm-ups >= 0 (got {self})")


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    model: str
    serve: ServeConfig  # ports are replaced with free ones when the row runs
    concurrency: int
    payload: str  # bench/payloads.py PAYLOADS: what ab sends
    baseline: bool = False
    itt: bool | None = None  # record ITT ranges (kit/itt.py); None = the plan's `itt`

    @property
    def label(self) -> str:
        return f"{self.model} / {self.name}"

    def records_itt(self, run: RunSettings) -> bool:
        return run.itt if self.itt is None else self.itt


def row_payload(where: str, model: str, name: str | None) -> str:
    """The row's payload for this model: the named one (it must fit the model) or the model's default."""
    loaded = Model.load(model)
    if name is None:
        return default_payload(loaded)
    if name not in PAYLOADS:
        raise PlanError(f"{where}: unknown payload {name!r}; choose one of {sorted(PAYLOADS)}")
    if not PAYLOADS[name].fits(loaded):
        fitting = sorted(n for n, kind in PAYLOADS.items() if kind.fits(loaded))
        raise PlanError(
            f"{where}: payload {name!r} does not fit {model} ({loaded.task.medium.value}); use one of {fitting}"
        )
    return name


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    run: RunSettings
    rows: tuple[Row, ...]
    peers: tuple[Peer, ...] = ()  # measured in-process for every model of the plan
    served_peers: tuple[ServedPeer, ...] = ()  # served and measured with ab for every model of the plan

    @property
    def archives(self) -> dict[str, list[str]]:
        """variant -> the models whose archives the plan serves, or reads (peers: the eager weights)."""
        needed: dict[str, dict[str, None]] = {}
        for row in self.rows:
            needed.setdefault(row.serve.variant.name, {})[row.model] = None
        if self.peers:
            needed.setdefault(EAGER_VARIANT, {}).update(dict.fromkeys(self.run.models))
        for peer in self.served_peers:
            needed.setdefault(peer.variant, {}).update(dict.fromkeys(self.run.models))
        return {variant: list(models) for variant, models in needed.items()}

    def estimate_s(self) -> float:
        """Rough wall time: start-up (warm compile cache), warm-up, measurement, stop, in-process, peers."""
        per_row = (
            45
            + self.run.seconds
            + self.run.warmup_seconds
            + (self.run.in_process_seconds + 30 if self.run.in_process else 0)
        )
        per_peer = 40 + self.run.in_process_seconds
        per_served_peer = 30 + self.run.seconds + self.run.warmup_seconds
        peers = len(self.peers) * per_peer + len(self.served_peers) * per_served_peer
        if self.run.rounds > 1:  # bench/versus/rounds.py: served rows and served peers only, each once a round
            per_row = 45 + self.run.seconds + self.run.warmup_seconds
            peers = len(self.served_peers) * per_served_peer
        return self.run.rounds * (len(self.rows) * per_row + peers * len(self.run.models))


def _expand(raw: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Cartesian product of list-valued keys; the suffix names the expanded values."""
    matrix = {key: value for key, value in raw.items() if isinstance(value, list) and key != "models"}
    if not matrix:
        return [(raw, "")]
    combos = []
    for values in itertools.product(*matrix.values()):
        chosen = dict(zip(matrix, values, strict=True))
        suffix = " ".join(f"{key}={value}" for key, value in chosen.items())
        combos.append(({**raw, **chosen}, suffix))
    return combos


def _rows(index: int, raw: dict[str, Any], run: RunSettings, topology: Topology | None) -> list[Row]:
    """The row's expansion over its list-valued keys and its models (those of the run it names)."""
    where = f"row {index + 1} ({raw.get('name', 'unnamed')!r})"
    if raw.get("threads") == THREADS_UP_TO_L3:  # none on a machine of one-core L3 domains
        raw = {**raw, "threads": thread_counts(topology or read_topology())}
    if "name" not in raw:
        raise PlanError(f"{where}: every row needs a name")
    unknown = sorted(set(raw) - ROW_KEYS - SERVE_KEYS)
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(ROW_KEYS | SERVE_KEYS)}")
    ports = sorted(set(raw) & PORT_KEYS)
    if ports:
        raise PlanError(f"{where}: {ports} are chosen by the bench (free loopback ports); remove them")
    rows = []
    for values, suffix in _expand(raw):
        overrides = {k: v for k, v in values.items() if k in SERVE_KEYS}
        for model in [m for m in values.get("models", run.models) if m in run.models]:
            try:
                serve = ServeConfig.from_preset(values.get("preset", "optimized"), models=[model], **overrides)
            except SettingsError as error:
                raise PlanError(f"{where}: {error}") from None
            name = f"{values['name']} {suffix}".strip()
            concurrency = values.get("concurrency", run.concurrency)
            payload = row_payload(where, model, values.get("payload"))
            itt = values.get("itt")
            if itt is not None and not isinstance(itt, bool):
                raise PlanError(f"{where}: itt must be true or false, got {itt!r}")
            rows.append(Row(name, model, serve, concurrency, payload, bool(values.get("baseline", False)), itt))
    return rows


def parse_plan(
    name: str, raw: dict[str, Any], topology: Topology | None = None, models: list[str] | None = None
) -> Plan:
    """`topology` (default: this machine's) sizes the rows that depend on it (`threads: up-to-l3`).
    `models` replaces the plan's: rows naming other models are left out, the others run for these."""
    raw = dict(raw or {})
    if models:
        try:
            check_models(models)
        except SettingsError as error:
            raise PlanError(str(error)) from None
        raw["models"] = list(models)
    row_specs = raw.pop("rows", None)
    if not row_specs:
        raise PlanError(f"plan {name!r} has no rows")
    try:
        peers = tuple(parse_settings(Peer, spec) for spec in raw.pop("peers", None) or ())
        served_peers = tuple(parse_settings(ServedPeer, spec) for spec in raw.pop("served_peers", None) or ())
    except SettingsError as error:
        raise PlanError(f"plan {name!r}, peers: {error}") from None
    try:
        run = parse_settings(RunSettings, raw)
    except SettingsError as error:
        raise PlanError(f"plan {name!r}: {error}") from None
    rows = [row for index, spec in enumerate(row_specs) for row in _rows(index, spec, run, topology)]
    for index, peer in enumerate(served_peers):
        for model in run.models:
            row_payload(f"served peer {index + 1} ({peer.name})", model, peer.payload)
    if not rows:
        raise PlanError(f"plan {name!r} has no row for the models {list(run.models)}")
    # All rows of a model together, models in the plan's order (stable: row order kept within).
    order = {model: i for i, model in enumerate(run.models)}
    rows.sort(key=lambda row: order.get(row.model, len(order)))
    # A row's results, server logs and ITT ranges are filed under its label: two rows of one label
    # would count each other's requests.
    labels = collections.Counter(row.label for row in rows)
    twice = sorted(label for label, count in labels.items() if count > 1)
    if twice:
        raise PlanError(f"plan {name!r}: several rows are labelled {twice}; give each its own name")
    for model, group in itertools.groupby(sorted(rows, key=lambda r: r.model), key=lambda r: r.model):
        baselines = [r.name for r in group if r.baseline]
        if len(baselines) > 1:
            raise PlanError(f"model {model} has several baseline rows {baselines}; mark one")
    return Plan(name, run, tuple(rows), peers, served_peers)


# A plan's `kind`: which driver runs it. Serving plans (rows of configurations, ab) are the
# default; a generate plan streams a language model against its peers (bench/generate/run.py).
SERVE, GENERATE = "serve", "generate"


def read_plan(name_or_path: str) -> tuple[str, dict]:
    """A plan file's name and contents, by name (bench/plans/NAME.yaml) or path."""
    path = Path(name_or_path) if name_or_path.endswith((".yaml", ".yml")) else PLANS / f"{name_or_path}.yaml"
    if not path.is_file():
        choices = ", ".join(sorted(p.stem for p in PLANS.glob("*.yaml")))
        raise PlanError(f"plan {name_or_path!r} not found; choose one of: {choices}, or a path to a .yaml file")
    raw = yaml.safe_load(path.read_text())
    if raw.get("kind", SERVE) not in (SERVE, GENERATE):
        raise PlanError(f"plan {path.stem!r}: kind {raw['kind']!r} is unknown; choose {SERVE} (default) or {GENERATE}")
    return path.stem, raw


def load_plan(name_or_path: str, models: list[str] | None = None) -> Plan:
    """A serving plan (kind: serve), parsed."""
    name, raw = read_plan(name_or_path)
    if raw.get("kind", SERVE) != SERVE:
        raise PlanError(f"plan {name!r} is kind {raw['kind']}: `python -m bench --plan {name}` runs it")
    return parse_plan(name, {k: v for k, v in raw.items() if k != "kind"}, models=models)
