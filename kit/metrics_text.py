"""The workers' serving numbers in Prometheus' text format, for a scrape of the router's /metrics.

    text = render(run_dir / "stages")    # every worker's stage file (handlers/stages.py) and
                                         # language-model engine file (handlers/generation/metrics.py)

Each series is labelled with the model and the worker's pid: a worker TorchServe starts again is
a new series whose counters start from 0, which Prometheus' rate() and increase() read as a
reset, as they do a restarted vLLM. `kit_stage_*` and `kit_requests_total`: where a handler's
calls spend their time, and how its requests ended. `kit_lm_*`: a language model's engine, named
as vLLM's (`vllm:` becomes `kit_lm_`), with its meanings, so a vLLM dashboard's queries carry over
with the prefix changed.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from pathlib import Path

from handlers.generation.metrics import BOUNDS_S, EngineMetrics, Gauges, Histogram, Snapshot, read_engine_files
from handlers.stages import BOUNDS_MS, WorkerStages, read_workers

STAGE_PREFIX = "kit_"
# Every 4th of the stage files' bounds: ~57 % apart, 29 buckets from 0.02 ms to 10 s. The files'
# finer buckets serve make status's quantiles; a scrape of 6 stages x 117 buckets per worker
# would be mostly zeros.
STAGE_BUCKETS = frozenset(range(0, len(BOUNDS_MS), 4))
PREFIX = "kit_lm_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name (after PREFIX), the EngineMetrics histogram, help (and the vLLM series it corresponds to)
HISTOGRAMS: tuple[tuple[str, Callable[[EngineMetrics], Histogram], str], ...] = (
    ("time_to_first_token_seconds", lambda m: m.first_token, "Time to first token (vllm:time_to_first_token_seconds)."),
    ("inter_token_latency_seconds", lambda m: m.inter_token, "Time between tokens (vllm:inter_token_latency_seconds)."),
    ("e2e_request_latency_seconds", lambda m: m.request, "Request's whole time (vllm:e2e_request_latency_seconds)."),
    ("request_queue_time_seconds", lambda m: m.queue, "Time waiting for a place (vllm:request_queue_time_seconds)."),
)
COUNTERS: tuple[tuple[str, Callable[[EngineMetrics], int], str], ...] = (
    ("prompt_tokens_total", lambda m: m.prompt_tokens, "Prompt tokens, once per request (vllm:prompt_tokens_total)."),
    ("generation_tokens_total", lambda m: m.generation_tokens, "Generated tokens (vllm:generation_tokens_total)."),
    (
        "prefix_cache_queries_total",
        lambda m: m.prefix_queried_tokens,
        "Prompt tokens looked up in the prefix cache (vllm:prefix_cache_queries_total).",
    ),
    (
        "prefix_cache_hits_total",
        lambda m: m.prefix_hit_tokens,
        "Prompt tokens the prefix cache held (vllm:prefix_cache_hits_total).",
    ),
    (
        "num_preemptions_total",
        lambda m: m.preemptions,
        "Sequences put back in the queue to make room in the KV cache, computed again later "
        "(vllm:num_preemptions_total).",
    ),
    (
        "spec_decode_num_draft_tokens_total",
        lambda m: m.draft_tokens,
        "Tokens prompt lookup drafted (vllm:spec_decode_num_draft_tokens_total).",
    ),
    (
        "spec_decode_num_accepted_tokens_total",
        lambda m: m.accepted_tokens,
        "Drafted tokens kept (vllm:spec_decode_num_accepted_tokens_total).",
    ),
)
GAUGES: tuple[tuple[str, Callable[[Gauges], float], str], ...] = (
    ("num_requests_running", lambda g: g.running, "Sequences generating (vllm:num_requests_running)."),
    ("num_requests_waiting", lambda g: g.waiting, "Sequences waiting for a place (vllm:num_requests_waiting)."),
    ("kv_cache_usage_perc", lambda g: g.kv_cache_usage, "KV cache share in use, 0 to 1 (vllm:kv_cache_usage_perc)."),
    ("prefix_store_bytes", lambda g: g.prefix_store_bytes, "KV bytes the prefix store holds beside the rows."),
)
FINISHED = "request_success_total"  # by finished_reason (vllm:request_success_total)


def labels(**values: object) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in values.items()) + "}"


def number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def histogram_lines(name: str, own: dict, buckets: list[tuple[float, int]], count: int, total: float) -> list[str]:
    """A histogram's samples: the cumulative count at each bound given, +Inf (every one), the sum and the count."""
    lines = [f"{name}_bucket{labels(**own, le=bound)} {seen}" for bound, seen in buckets]
    lines.append(f"{name}_bucket{labels(**own, le='+Inf')} {count}")
    return [*lines, f"{name}_sum{labels(**own)} {number(total)}", f"{name}_count{labels(**own)} {count}"]


def family(lines: list[str], name: str, kind: str, help_text: str) -> None:
    lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])


def render(stages_dir: Path) -> str:
    stages, engines = list(read_workers(stages_dir)), list(read_engine_files(stages_dir))
    outcomes = [(w.model, w.pid, w.outcomes) for w in stages] + [(m, p, s.metrics.outcomes) for m, p, s in engines]
    return stage_series(stages) + outcome_series(outcomes) + engine_series(engines)


def stage_series(workers: list[WorkerStages]) -> str:
    """Per worker and stage: the calls' times (a histogram, seconds), the requests they served
    and the CPU time spent in them (counters)."""
    lines: list[str] = []
    name = f"{STAGE_PREFIX}stage_seconds"
    family(lines, name, "histogram", "A stage's wall time per call of the handler (a call serves a batch).")
    for worker in workers:
        for stage, histogram in worker.histograms.items():
            own = {"model_name": worker.model, "pid": worker.pid, "stage": stage.value}
            running = enumerate(accumulate(histogram.counts[: len(BOUNDS_MS)]))
            buckets = [(BOUNDS_MS[index] / 1000, seen) for index, seen in running if index in STAGE_BUCKETS]
            lines += histogram_lines(name, own, buckets, histogram.calls, histogram.total_ms / 1000)
    for suffix, value_of, help_text in (
        ("stage_requests_total", lambda h: h.requests, "Requests the stage's calls served."),
        ("stage_cpu_seconds_total", lambda h: number(h.cpu_ms / 1000), "The worker's CPU time in the stage."),
    ):
        family(lines, f"{STAGE_PREFIX}{suffix}", "counter", help_text)
        for worker in workers:
            for stage, histogram in worker.histograms.items():
                own = labels(model_name=worker.model, pid=worker.pid, stage=stage.value)
                lines.append(f"{STAGE_PREFIX}{suffix}{own} {value_of(histogram)}")
    return "\n".join(lines) + "\n"


def outcome_series(workers: list[tuple[str, int, dict[str, int]]]) -> str:
    """Per worker (a classifier's stage file, a language model's engine file), its requests by
    outcome: one family, whichever file counted them."""
    lines: list[str] = []
    name = f"{STAGE_PREFIX}requests_total"
    family(lines, name, "counter", 'Requests by how they ended: "ok", "failed", or the refusal\'s reason.')
    for model, pid, outcomes in workers:
        for outcome, count in sorted(outcomes.items()):
            lines.append(f"{name}{labels(model_name=model, pid=pid, outcome=outcome)} {count}")
    return "\n".join(lines) + "\n"


def engine_series(workers: list[tuple[str, int, Snapshot]]) -> str:
    lines: list[str] = []

    for name, histogram_of, help_text in HISTOGRAMS:
        family(lines, PREFIX + name, "histogram", help_text)
        for model, pid, snapshot in workers:
            histogram = histogram_of(snapshot.metrics)
            buckets = list(zip(BOUNDS_S, accumulate(histogram.counts), strict=False))  # the overflow: +Inf
            own = {"model_name": model, "pid": pid}
            lines += histogram_lines(PREFIX + name, own, buckets, histogram.count, histogram.total)
    for name, value_of, help_text in COUNTERS:
        family(lines, PREFIX + name, "counter", help_text)
        lines += [f"{PREFIX}{name}{labels(model_name=m, pid=p)} {value_of(s.metrics)}" for m, p, s in workers]
    family(lines, PREFIX + FINISHED, "counter", "Requests ended, by why (vllm:request_success_total).")
    for model, pid, snapshot in workers:
        for reason, count in sorted(snapshot.metrics.finished.items()):
            lines.append(f"{PREFIX}{FINISHED}{labels(model_name=model, pid=pid, finished_reason=reason)} {count}")
    for name, value_of, help_text in GAUGES:
        family(lines, PREFIX + name, "gauge", help_text)
        lines += [f"{PREFIX}{name}{labels(model_name=m, pid=p)} {number(value_of(s.gauges))}" for m, p, s in workers]
    return "\n".join(lines) + "\n"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def engine_table(stages_dir: Path) -> list[str]:
    """Lines of a table (make status): per language-model worker, its requests, tokens, time to
    first token and inter-token latency p50 / p99, and its gauges now; no lines without one."""
    workers = list(read_engine_files(stages_dir))
    if not workers:
        return []
    lines = [
        f"{'model':12} {'pid':>7} {'requests':>8} {'prompt':>8} {'generated':>9} {'TTFT p50/p99 ms':>16} "
        f"{'ITL p50/p99 ms':>15} {'running':>7} {'waiting':>7} {'KV use':>6}"
    ]
    for model, pid, snapshot in workers:
        m, g = snapshot.metrics, snapshot.gauges
        ttft = f"{ms(m.first_token.quantile(0.5))}/{ms(m.first_token.quantile(0.99))}"
        itl = f"{ms(m.inter_token.quantile(0.5))}/{ms(m.inter_token.quantile(0.99))}"
        lines.append(
            f"{model:12} {pid:>7} {m.request.count:>8} {m.prompt_tokens:>8} {m.generation_tokens:>9} {ttft:>16} "
            f"{itl:>15} {g.running:>7} {g.waiting:>7} {g.kv_cache_usage:>6.0%}"
        )
    return lines
