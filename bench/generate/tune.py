"""`make tune MODELS=lm`: a language model's variant and sequences per worker, measured streamed.

    tune_models(["lm"], Tuning(streams=16, rounds=2, seconds=30, itl_ms=0), None, "tuned", None, run_dir)
    # -> config/presets/tuned.yaml; by parts: measure_candidates, choose, write_lm_preset

The candidates: each kit variant of `make bench PLAN=generate` this CPU computes, on both of its
backends (`inductor` and `openvino`; where it computes bf16, `inductor-bf16`, `openvino-bf16`,
and on int8 weights `inductor-bf16-woq`, `openvino-bf16-woq`) times the sequences each worker generates at
once, from a quarter of the streams offered up to all of them in powers of two (4, 8, 16 at 16
streams). More sequences than streams never fill; far fewer leave streams waiting. Each candidate
is a server of its own (the KV cache is allocated once, for its sequences), started, warmed,
measured at the streams offered with the generate bench's workload (bench/generate/streams.py) and
stopped; the rounds rotate the order (hosts drift ±20 % over a run). A candidate whose worker
does not start (the accuracy guard refused its precision) is out, with the reason; one the memory
plan gave fewer sequences than asked is measured as served, once.

The winner: the most output tokens/s (median over the rounds) among the candidates whose
inter-token latency p50 meets `itl_ms` (0: no limit); within 3 % of it, the one with fewer
sequences (less memory, shorter steps). Then prompt lookup (handlers/generation/lookup.py): the
winner with `prompt_lookup` drafts and without, measured again in rotated rounds; lookup is served
only where it wrote more than 3 % more tokens/s within the ITL limit (its drafts cost compute
where the answers repeat nothing). The preset names the model's variant (`model_variants` when it
differs from the others'), its sequences (`model_sequences`) and, where it paid, its prompt lookup
(`model_settings`), and says what was measured.
"""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench.generate.run import WARMUP_S
from bench.generate.streams import StreamStats, measure_streams
from bench.generate.systems import KIT_VARIANTS, completions_url, kit_variants
from bench.generate.workloads import WORKLOADS, tokenizer_of
from bench.tune import save_preset
from kit.layout import PlanError
from kit.models import Model
from kit.paths import ROOT
from kit.serve_config import PRESETS, ConfigError, ServeConfig
from kit.server import ServerError, start_ready
from kit.topology import read_topology
from kit.variant import Variant

# Tokens/s within this share of the best are a tie (rounds differ by more); fewer sequences win it.
TIE = 0.03
WARMUP_STREAMS = 2


def log(message: str) -> None:
    print(f"[tune] {message}", flush=True)


@dataclasses.dataclass(frozen=True)
class Tuning:
    streams: int = 16  # the load offered: concurrent streams
    rounds: int = 2
    seconds: float = 30  # per candidate and round
    itl_ms: float = 0  # the inter-token latency p50 the choice must meet; 0: none
    lookup: int = 4  # prompt lookup's drafted tokens tried on the winner; 0: not tried
    workload: str = "text"  # the traffic measured (bench/generate/workloads.py): text, copy, ...

    def __post_init__(self) -> None:
        if self.streams < 1 or self.rounds < 1 or self.seconds <= 0 or self.itl_ms < 0 or self.lookup < 0:
            raise ValueError(
                f"need streams >= 1, rounds >= 1, seconds > 0, itl_ms >= 0 and lookup >= 0, got {self.streams}, "
                f"{self.rounds}, {self.seconds}, {self.itl_ms}, {self.lookup}"
            )
        if self.workload not in WORKLOADS:
            raise ValueError(f"no workload {self.workload!r}; choose one of {', '.join(WORKLOADS)}")


@dataclasses.dataclass(frozen=True)
class Candidate:
    variant: str
    sequences: int  # at once (a memory budget gives them a smaller KV cache, not fewer of them)
    lookup: int = 0  # prompt lookup's drafted tokens (the preset's model_settings); 0: off

    @property
    def name(self) -> str:
        return f"{self.variant} x{self.sequences}" + (f" lookup {self.lookup}" if self.lookup else "")

    @property
    def settings(self) -> dict[str, int]:
        """What the preset serves over the archive's settings (ServeConfig.model_settings)."""
        return {"prompt_lookup": self.lookup} if self.lookup else {}


@dataclasses.dataclass
class Measured:
    candidate: Candidate
    model: str
    served: int = 0  # sequences its worker served (the plan's); 0: not started yet
    runs: list[StreamStats] = dataclasses.field(default_factory=list)
    failure: str = ""  # why it is out

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(r.output_tokens_per_s for r in self.runs)

    @property
    def itl_ms(self) -> float:
        return statistics.median(r.itl_ms.p50 for r in self.runs)

    @property
    def ttft_ms(self) -> float:
        return statistics.median(r.ttft_ms.p50 for r in self.runs)

    @property
    def usable(self) -> bool:
        return not self.failure and bool(self.runs) and all(r.errors == 0 for r in self.runs)

    def summary(self) -> str:
        if not self.usable:
            return f"{self.candidate.name}: out ({self.failure or 'requests failed'})"
        lookup = f", prompt lookup {self.candidate.lookup}" if self.candidate.lookup else ""
        return (
            f"{self.candidate.variant} x{self.served} sequences{lookup}: {self.tokens_per_s:.1f} tokens/s, "
            f"ITL p50 {self.itl_ms:.0f} ms, TTFT p50 {self.ttft_ms:.0f} ms"
        )


def sequence_choices(streams: int) -> list[int]:
    """Powers of two from a quarter of `streams` up to it, and `streams` itself."""
    choices, count = [], 1
    while count < streams:
        if 4 * count >= streams:
            choices.append(count)
        count *= 2
    return [*choices, streams]


def served_variants() -> list[str]:
    """The generate bench's kit variants this CPU computes, one per backend and precision."""
    return [variant for backend in KIT_VARIANTS for variant in kit_variants(backend).values()]


def candidates(variants: list[str], streams: int) -> list[Candidate]:
    return [Candidate(v, n) for v in variants for n in sequence_choices(streams)]


def choose(measured: list[Measured], itl_ms: float) -> tuple[Measured, str]:
    """The winner among the usable candidates, and why; ValueError when none is usable."""
    usable = [m for m in measured if m.usable]
    if not usable:
        raise ValueError("no candidate served without errors: " + "; ".join(m.summary() for m in measured))
    within = [m for m in usable if not itl_ms or m.itl_ms <= itl_ms]
    if not within:
        fastest = min(usable, key=lambda m: m.itl_ms)
        return fastest, f"no candidate met ITL p50 <= {itl_ms:.0f} ms: the lowest ITL ({fastest.itl_ms:.0f} ms)"
    best = max(m.tokens_per_s for m in within)
    tied = [m for m in within if m.tokens_per_s >= (1 - TIE) * best]
    winner = min(tied, key=lambda m: (m.served, -m.tokens_per_s))
    why = "the most tokens/s" + (f" with ITL p50 <= {itl_ms:.0f} ms" if itl_ms else "")
    if winner.tokens_per_s < best:
        why += f" (within {TIE:.0%} of the best, with fewer sequences)"
    return winner, why


def choose_lookup(plain: Measured, drafting: Measured, itl_ms: float) -> tuple[Measured, str]:
    """The winner measured again without and with prompt lookup: lookup where it paid."""
    if not drafting.usable:
        return plain, f"prompt lookup not served: {drafting.summary()}"
    if itl_ms and drafting.itl_ms > itl_ms:
        return plain, f"prompt lookup not served: ITL p50 {drafting.itl_ms:.0f} ms > {itl_ms:.0f} ms"
    gain = drafting.tokens_per_s / plain.tokens_per_s - 1 if plain.usable and plain.tokens_per_s else float("inf")
    if gain <= TIE:
        return plain, f"prompt lookup not served: {gain:+.0%} tokens/s (it pays above +{TIE:.0%})"
    return drafting, f"prompt lookup served: {gain:+.0%} tokens/s"


def config_of(model: Model, candidate: Candidate) -> ServeConfig:
    # The optimized preset as `make serve` starts it, with the candidate's variant and sequences.
    return ServeConfig.from_preset(
        "optimized",
        variant=candidate.variant,
        models=[model.name],
        model_sequences={model.name: candidate.sequences},
        model_settings={model.name: candidate.settings} if candidate.settings else {},
    )


def measure_once(model: Model, entry: Measured, tuning: Tuning, run_dir: Path) -> None:
    """One round of one candidate: its server started, warmed, measured and stopped."""
    started = time.monotonic()
    try:
        server = start_ready(config_of(model, entry.candidate), run_dir, progress=log)
    except ServerError as error:
        entry.failure = f"did not start: {str(error).splitlines()[0]}"
        log(f"{entry.candidate.name}: {entry.failure}")
        return
    try:
        entry.served = server.layout.models[model.name].sequences
        url = completions_url(server, model.name)
        asks = WORKLOADS[tuning.workload](tokenizer_of(model))
        log(
            f"{entry.candidate.name}: started in {time.monotonic() - started:.0f} s, {entry.served} sequences; measuring"
        )
        measure_streams(url, model.name, asks, WARMUP_STREAMS, min(WARMUP_S, tuning.seconds))
        stats = measure_streams(url, model.name, asks, tuning.streams, tuning.seconds)
        entry.runs.append(stats)
        log(f"{entry.candidate.name}: {stats.summary()}")
    finally:
        server.stop()


def skip_reason(model: Model, entry: Measured) -> str:
    """Why `entry` is not measured on this machine: the memory plan refuses it; "" when it is
    measured. (A tight budget gives a smaller KV cache, not fewer sequences: every candidate's
    sequences are served, sharing what there is.)"""
    try:
        config_of(model, entry.candidate).layout(read_topology())
    except PlanError as error:
        return f"the memory plan refuses it: {error}"
    return ""


def measure_candidates(
    model: Model, tuning: Tuning, run_dir: Path, variants: list[str] | None = None
) -> list[Measured]:
    """Every candidate measured `tuning.rounds` times, in rotated orders (their archives built first)."""
    variants = variants or served_variants()
    build = [sys.executable, "-m", "model_store.build", "--models", model.name, "--variants", ",".join(variants)]
    if subprocess.run(build, cwd=ROOT).returncode != 0:
        raise ValueError(f"building the {variants} archives of {model.name} failed (output above)")
    measured = [Measured(c, model.name) for c in candidates(variants, tuning.streams)]
    measure_rounds(model, measured, tuning, run_dir)
    return measured


def measure_rounds(model: Model, measured: list[Measured], tuning: Tuning, run_dir: Path) -> None:
    """`tuning.rounds` rounds of every entry, each in a rotated order."""
    for round_ in range(tuning.rounds):
        shift = round_ % len(measured)
        for entry in measured[shift:] + measured[:shift]:
            if not entry.failure:
                entry.failure = skip_reason(model, entry)
            if entry.failure:
                continue
            log(f"round {round_ + 1}/{tuning.rounds}: {entry.candidate.name}")
            candidate = entry.candidate
            lookup = f"-lookup{candidate.lookup}" if candidate.lookup else ""
            measure_once(model, entry, tuning, run_dir / f"{candidate.variant}-{candidate.sequences}{lookup}-r{round_}")


def measure_lookup(model: Model, winner: Measured, tuning: Tuning, run_dir: Path) -> tuple[Measured, Measured]:
    """The winner without and with prompt lookup, measured again in the same rounds."""
    asked = winner.candidate
    pair = [Measured(asked, model.name), Measured(dataclasses.replace(asked, lookup=tuning.lookup), model.name)]
    measure_rounds(model, pair, tuning, run_dir / "lookup")
    return pair[0], pair[1]


def write_lm_preset(name: str, chosen: list[tuple[Measured, str]], base: dict | None) -> Path:
    """The preset `name` serving each chosen model with its variant and sequences. `base`: the
    preset this run already wrote for the other models (make tune MODELS=bert,lm), else the
    optimized preset's fields serve them alone."""
    layout = dict(base) if base is not None else yaml.safe_load((PRESETS / "optimized.yaml").read_text())
    models = list(layout.get("models") or [])
    if base is None:
        layout["variant"] = chosen[0][0].candidate.variant
    variants, sequences = dict(layout.get("model_variants") or {}), dict(layout.get("model_sequences") or {})
    settings = dict(layout.get("model_settings") or {})
    for entry, _ in chosen:
        models.append(entry.model)
        if entry.candidate.variant != Variant.load(layout.get("variant", ServeConfig.variant)).name:
            variants[entry.model] = entry.candidate.variant
        sequences[entry.model] = entry.served
        if entry.candidate.settings:
            settings[entry.model] = entry.candidate.settings
    layout = {"models": sorted(set(models)), **{k: v for k, v in layout.items() if k != "models"}}
    layout.update(({"model_variants": variants} if variants else {}), model_sequences=sequences)
    layout.update({"model_settings": settings} if settings else {})
    header = "".join(f"# Written by `make tune` for {e.model}: {e.summary()}; {why}\n" for e, why in chosen)
    return save_preset(name, layout, header, keep_header=base is not None)


def tune_models(
    names: list[str], tuning: Tuning, variants: list[str] | None, preset: str, base: dict | None, out_dir: Path
) -> int:
    """Each language model's variant and sequences, measured streamed, written into `preset`."""
    chosen = []
    for name in names:
        started = time.monotonic()
        try:
            measured = measure_candidates(Model.load(name), tuning, out_dir / name, variants)
            for entry in measured:
                log(entry.summary())
            winner, why = choose(measured, tuning.itl_ms)
            if tuning.lookup:
                plain, drafting = measure_lookup(Model.load(name), winner, tuning, out_dir / name)
                for entry in (plain, drafting):
                    log(entry.summary())
                winner, lookup_why = choose_lookup(plain, drafting, tuning.itl_ms)
                why = f"{why}; {lookup_why}"
            chosen.append((winner, why))
        except ValueError as error:
            log(f"ERROR: no preset written: {name}: {error}")
            return 1
        log(f"{name}: {chosen[-1][0].summary()}, chosen: {chosen[-1][1]} ({(time.monotonic() - started) / 60:.0f} min)")
    try:
        path = write_lm_preset(preset, chosen, base)
    except ConfigError as error:  # e.g. the other models' layout is not placement plan
        log(f"ERROR: no preset written: {error}")
        return 1
    log(f"written to {path}; serve it with `make serve CONFIG={preset}`")
    return 0
