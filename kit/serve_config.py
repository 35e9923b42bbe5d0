"""A serving configuration as typed data, rendered into TorchServe's config.properties.

    config = ServeConfig.from_preset("optimized")
    layout = config.layout(read_topology())          # placement plan: every worker's cores
    text = render(config, model_store=config.variant.store, layout=layout)

Presets live in config/presets/*.yaml; the template in config/config.properties.template.

One module, because a field of ServeConfig and the property, JVM flag or worker variable it
becomes must change together: the typed record and its rendering stay side by side.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import ipaddress
import os
from pathlib import Path
from typing import Any

import yaml

from handlers.generation.settings import GenerationSettings
from handlers.switches import Diagnostics
from handlers.typed_config import SettingsError, parse_settings
from kit.footprint import recorded
from kit.kv_cache import served_sequences
from kit.layout import PREFERRED_ALLOCATOR, Allocator, Demand, Layout, Objective, OmpWaitPolicy
from kit.models import grouping, model_names, omp_wait_policy
from kit.paths import CONFIG
from kit.plan import plan_layout
from kit.ports import (
    GRPC_INFERENCE_PORT,
    GRPC_MANAGEMENT_PORT,
    INFERENCE_PORT,
    MANAGEMENT_PORT,
    METRICS_PORT,
    OPENAI_PORT,
    PORTS,
)
from kit.topology import Memory, Topology, TopologyError, format_cpus, parse_cpus, parse_size
from kit.variant import Variant

PRESETS = CONFIG / "presets"


ConfigError = SettingsError  # one error type for every typed config in the kit


class Placement(enum.StrEnum):
    """Who decides which cores each worker runs on."""

    # The kit: a layout planned from this machine's topology, CPU set and quota (kit/plan.py),
    # each worker pinned to its planned cores and NUMA node by kit/pin_worker.py.
    PLAN = "plan"
    # TorchServe's cpu_launcher with a fixed workers x threads: worker i of *every* model on
    # cores i*threads.., read from the host's lscpu (not the CPU set).
    LAUNCHER = "launcher"
    NONE = "none"  # no pinning: TorchServe's defaults


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    # config/variants/<name>.yaml: presets name it, __post_init__ resolves the name once.
    variant: Variant = "inductor"
    models: tuple[str, ...] = dataclasses.field(default_factory=lambda: tuple(model_names()))
    # Per model, a variant other than `variant` ({bert: openvino}): what `make tune` writes when
    # the backends win on different models. Every variant must run in one Python environment.
    model_variants: dict[str, Variant] = dataclasses.field(default_factory=dict, hash=False)
    # Per language model, the sequences each worker generates at once ({lm: 16}), in place of its
    # settings' max_sequences: what `make tune MODELS=lm` measured best. The memory plan may serve
    # fewer (placement plan only: the plan tells the workers).
    model_sequences: dict[str, int] = dataclasses.field(default_factory=dict, hash=False)
    # Per language model, handler settings served over its archive's ({lm: {prompt_lookup: 4}}),
    # those a worker reads as it starts (GenerationSettings.SERVED): what `make tune MODELS=lm`
    # writes where prompt lookup paid.
    model_settings: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict, hash=False)
    bind: str = "127.0.0.1"  # inference and metrics APIs
    # The management API can load, scale and delete models: loopback unless asked explicitly.
    management_bind: str = "127.0.0.1"
    inference_port: int = INFERENCE_PORT
    management_port: int = MANAGEMENT_PORT
    metrics_port: int = METRICS_PORT
    # TorchServe 0.12 always starts its gRPC APIs; the kit keeps them on loopback, unused.
    grpc_inference_port: int = GRPC_INFERENCE_PORT
    grpc_management_port: int = GRPC_MANAGEMENT_PORT
    worker_port: int = 9000  # first of the frontend<->worker socket ports
    # The one OpenAI base URL for every language model and embedder (kit/openai_router.py), bound
    # where the inference API is; 0: none.
    openai_port: int = OPENAI_PORT
    placement: Placement = Placement.PLAN
    objective: Objective = Objective.THROUGHPUT  # placement plan: many 1-thread workers, or 1 per L3 domain
    # Serve on these CPUs only ("8-15"), like a cpuset; "" = every CPU this process may use.
    cpus: str = ""
    # Serve within this much memory ("6Gi"), like a cgroup limit; "" = the cgroup's limit, else the
    # machine's memory. The plan fits the workers' measured footprints into it (kit/plan.py).
    memory: str = ""
    # Per model. placement plan: decided by the plan (leave null); launcher: fixed;
    # none: null = TorchServe's default (one per core).
    workers: int | None = None
    # Per worker. plan: cores per worker (null: the objective decides); launcher: cores per
    # worker; none: OMP_NUM_THREADS (null: torch's default, all cores).
    threads: int | None = None
    allocator: Allocator = PREFERRED_ALLOCATOR
    omp_wait_policy: OmpWaitPolicy = OmpWaitPolicy.PASSIVE
    # TorchServe's batchSize. 1 in the default preset: on the 2-core AVX2 EPYC batches of 4 and 8
    # were level with no batching under load and doubled an Inductor worker's start (`make bench
    # PLAN=batching`, docs/benchmarks.md); `make tune` picks a batch where it pays.
    batch_size: int = 1
    # TorchServe waits up to this long in total for more requests after a batch's first: 1 ms takes
    # what is already queued, and a lone request waits ~1 ms. 5 ms cost 41 % at concurrency 4 and
    # 1 ms never lost to no batching (`make bench PLAN=batching`, docs/benchmarks.md).
    max_batch_delay_ms: int = 1
    # Bodies above this are refused by the frontend (413) before any worker sees them; a
    # 12 MP camera JPEG is 3-8 MB.
    max_request_mb: int = 16
    # None = automatic: off on loopback, on for any other bind.
    token_auth: bool | None = None
    # JVM options of TorchServe's Java frontend, as its `vmargs`; "" = the JVM's own choice (G1).
    # The serial collector: less frontend CPU per request than G1 in every round on every payload
    # measured (`make bench PLAN=frontend`, docs/benchmarks.md). Only the quick (C1) compiler:
    # C2 was still compiling TorchServe's request path minutes into a load, ~0.5 ms of CPU per
    # request on the cores the workers need, for no cheaper request after (`make bench PLAN=versus`).
    # A young generation of 24 MiB, and Netty's buffers in chunks of 4 MiB (Netty's own default
    # since 4.1.76; TorchServe 0.12 ships 4.1.53, whose 16 MiB chunks, one per arena and two arenas
    # a core, were 64 MB of the frontend's memory on 2 cores; the gRPC server's shaded Netty alike):
    # the JVM's PSS after 20 s of 4 clients embedding with MiniLM, 133 MB against 277 MB (2-core
    # Xeon). Requests a second in those single runs: 133 and 152 against 156, 146 and 151, no
    # change beyond the noise between runs; not an interleaved measurement.
    frontend_jvm_args: str = (
        "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xmn24m -Dio.netty.allocator.maxOrder=9 "
        "-Dio.grpc.netty.shaded.io.netty.allocator.maxOrder=9"
    )
    # What the workers record or do differently (handlers/switches.py), e.g.
    # `diagnostics: {profile_requests: 20}`: a profiler trace of each worker's first 20 calls.
    diagnostics: Diagnostics = Diagnostics()
    # Record every worker's ITT ranges into this directory with the kit's collector (kit/itt.py):
    # a timeline without VTune. "" = no collector (the ranges cost nothing then).
    itt_trace_dir: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.variant, str):
            object.__setattr__(self, "variant", Variant.load(self.variant))
        object.__setattr__(
            self,
            "model_variants",
            {
                model: Variant.load(variant) if isinstance(variant, str) else variant
                for model, variant in self.model_variants.items()
            },
        )
        if not isinstance(self.diagnostics, Diagnostics):
            raise ConfigError(f"diagnostics must be a mapping (key: value), got {self.diagnostics!r}")
        strangers = sorted(set(self.model_variants) - set(self.models))
        if strangers:
            raise ConfigError(f"model_variants names {strangers}, which are not served (models: {list(self.models)})")
        if strangers := sorted(set(self.model_sequences) - set(self.models)):
            raise ConfigError(f"model_sequences names {strangers}, which are not served (models: {list(self.models)})")
        if strangers := sorted(set(self.model_settings) - set(self.models)):
            raise ConfigError(f"model_settings names {strangers}, which are not served (models: {list(self.models)})")
        for model, served in self.model_settings.items():
            try:
                GenerationSettings.served_over({}, served)
            except (SettingsError, TypeError, AttributeError) as error:
                raise ConfigError(f"model_settings of {model}: {error}") from None
        if wrong := {m: n for m, n in self.model_sequences.items() if type(n) is not int or n < 1}:
            raise ConfigError(f"model_sequences takes a number of sequences >= 1 per model, got {wrong}")
        if self.model_sequences and self.placement is not Placement.PLAN:
            raise ConfigError(
                f"model_sequences needs placement: plan (the plan tells each worker its sequences), "
                f"got placement: {self.placement.value}"
            )
        environments = {self.variant_of(model).environment for model in self.models}
        if len(environments) > 1:
            raise ConfigError(
                f"model_variants mixes variants of different Python environments ({sorted(map(str, environments))}): "
                "one TorchServe runs one environment; serve those models from separate servers"
            )
        if self.placement is Placement.LAUNCHER and len({self.allocator_of(model) for model in self.models}) > 1:
            raise ConfigError(
                "model_variants needs different allocators per model, which TorchServe's launcher cannot give "
                "(one for every worker); use placement: plan"
            )
        if self.cpus:
            try:  # the syntax now; whether this process may use them, when the server starts
                parse_cpus(self.cpus)
            except TopologyError as error:
                raise ConfigError(f"cpus: {error}") from None
        self.memory_limit  # noqa: B018 - parsed now: a wrong size is an error when the preset loads
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"workers must be >= 1 or null, got {self.workers}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1 or null, got {self.threads}")
        if self.placement is Placement.PLAN and self.workers is not None:
            raise ConfigError(
                f"workers: {self.workers} with placement plan: the plan gives each model its workers from the "
                "machine (`python -m kit plan` shows them); leave workers null, or set placement: launcher"
            )
        usable = len(os.sched_getaffinity(0))
        if self.placement is Placement.LAUNCHER and (self.workers or 1) * (self.threads or 1) > usable:
            # The launcher pins each worker to its own cores; it cannot hand out more than exist.
            # (It reads the host's lscpu, so a narrower `cpus` binds only the frontend.)
            raise ConfigError(
                f"workers x threads = {self.workers} x {self.threads} exceeds the {usable} CPUs "
                "this process may use; lower one of them"
            )
        if self.allocator is not Allocator.DEFAULT and self.placement is Placement.NONE:
            raise ConfigError(
                f"allocator {self.allocator.value!r} is preloaded for pinned workers; set placement: plan or launcher"
            )
        if self.max_request_mb < 1:
            raise ConfigError(f"max_request_mb must be >= 1, got {self.max_request_mb}")
        if self.batch_size < 1 or self.max_batch_delay_ms < 0:
            raise ConfigError(
                f"need batch_size >= 1 and max_batch_delay_ms >= 0, got {self.batch_size}, {self.max_batch_delay_ms}"
            )
        not_options = [arg for arg in self.frontend_jvm_args.split() if not arg.startswith("-")]
        if not_options:
            raise ConfigError(f"frontend_jvm_args takes JVM options (each starting with '-'), got {not_options}")
        exposed = [address for address in (self.bind, self.management_bind) if not is_loopback(address)]
        if self.token_auth is False and exposed:
            raise ConfigError(f"token_auth cannot be off on the non-loopback bind {exposed[0]}")

    @property
    def allowed_cpus(self) -> set[int]:
        """The CPUs the server may use: this process's affinity, narrowed by `cpus`."""
        allowed = os.sched_getaffinity(0)
        if not self.cpus:
            return allowed
        wanted = parse_cpus(self.cpus)
        if not wanted <= allowed:
            raise ConfigError(
                f"cpus {self.cpus!r} includes CPUs {format_cpus(wanted - allowed)} this process may not use "
                f"(allowed: {format_cpus(allowed)})"
            )
        return wanted

    @functools.cached_property
    def memory_limit(self) -> int | None:
        """`memory` in bytes; None: no budget of its own (the cgroup's, else the machine's)."""
        if not self.memory:
            return None
        try:
            return parse_size(self.memory)
        except TopologyError as error:
            raise ConfigError(f"memory: {error}") from None

    def layout(self, topology: Topology) -> Layout | None:
        """The planned layout of placement plan on `topology` (narrowed to `cpus`); None otherwise."""
        if self.placement is not Placement.PLAN:
            return None
        if self.cpus:
            topology = topology.restricted(self.allowed_cpus)
        if (limit := self.memory_limit) is not None:
            machine = topology.memory or Memory(limit, limit)
            limit = min(limit, machine.limit or limit)  # a narrower cgroup limit still binds
            topology = dataclasses.replace(topology, memory=dataclasses.replace(machine, limit=limit))
        demands = [self.demand(model) for model in self.models]
        return plan_layout(topology, demands, self.objective, self.threads)

    def demand(self, model: str) -> Demand:
        """What the plan needs of one served model: its archive's measured footprint and, for a
        language model, its KV cache."""
        archive = self.variant_of(model).archive(model)
        footprint = recorded(archive, self.batch_size)
        sequences = served_sequences(model, archive)
        for field in ("model_sequences", "model_settings"):
            if model in getattr(self, field) and sequences is None:
                raise ConfigError(f"{field} names {model!r}, which is not a language model (or has no archive)")
        if model in self.model_sequences:
            sequences = dataclasses.replace(sequences, most=self.model_sequences[model])
        if sequences and footprint and not footprint.sequences:
            footprint = None  # recorded before the kit counted a language model's sequences: measure again
        return Demand(
            model,
            allocator=self.allocator_of(model).value,
            footprint=footprint,
            grouping=grouping(model),
            sequences=sequences,
            omp_wait_policy=omp_wait_policy(model),
        )

    def variant_of(self, model: str) -> Variant:
        return self.model_variants.get(model, self.variant)

    def archives(self) -> dict[str, Path]:
        """Every served model's archive, from its variant's store."""
        return {model: self.variant_of(model).archive(model) for model in self.models}

    @property
    def mixed_variants(self) -> bool:
        return len({self.variant_of(model) for model in self.models}) > 1

    def allocator_for(self, variant: Variant) -> Allocator:
        """The allocator workers of `variant` get: the preset's, unless its backend cannot run with
        a preloaded one (OpenVINO; see handlers/backends), which keeps glibc malloc."""
        return self.allocator if variant.preloaded_allocator else Allocator.DEFAULT

    def allocator_of(self, model: str) -> Allocator:
        return self.allocator_for(self.variant_of(model))

    @property
    def served_allocator(self) -> Allocator:
        """The allocator of the preset's own variant (the bench serves one model per server)."""
        return self.allocator_for(self.variant)

    @property
    def token_auth_enabled(self) -> bool:
        if self.token_auth is not None:
            return self.token_auth
        return not (is_loopback(self.bind) and is_loopback(self.management_bind))

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as a preset would write them: `parse_settings(ServeConfig, d)` is the inverse."""

        def plain(value: Any) -> Any:
            if isinstance(value, Variant):
                return value.name
            if dataclasses.is_dataclass(value):  # a section (diagnostics)
                return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
            if isinstance(value, dict):
                return {key: plain(item) for key, item in value.items()}
            if isinstance(value, enum.Enum):
                return value.value
            return list(value) if isinstance(value, tuple) else value

        return {field.name: plain(getattr(self, field.name)) for field in dataclasses.fields(self)}

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ServeConfig:
        path = Path(name) if name.endswith((".yaml", ".yml")) else PRESETS / f"{name}.yaml"
        if not path.is_file():
            choices = ", ".join(sorted(p.stem for p in PRESETS.glob("*.yaml")))
            raise ConfigError(f"preset {name!r} not found; choose one of: {choices}, or a path to a .yaml file")
        raw = yaml.safe_load(path.read_text()) or {}
        # A section given both ways (diagnostics) keeps the preset's keys the overrides leave out.
        sections = {
            k: {**raw[k], **v} for k, v in overrides.items() if isinstance(v, dict) and isinstance(raw.get(k), dict)
        }
        return parse_settings(cls, {**raw, **overrides, **sections})


def free_ports_config(config: ServeConfig) -> ServeConfig:
    """The same layout on ports picked for it by kit/ports.py (tests, benchmarks, soak). The
    worker port stays: on Linux it only numbers the worker sockets (`.ts.sock.<port>`), which
    live in each server's own TMPDIR (kit/launch.py)."""
    inference, management, metrics, grpc_inference, grpc_management, openai = PORTS.take(6)
    return dataclasses.replace(
        config,
        openai_port=openai if config.openai_port else 0,
        inference_port=inference,
        management_port=management,
        metrics_port=metrics,
        grpc_inference_port=grpc_inference,
        grpc_management_port=grpc_management,
    )
