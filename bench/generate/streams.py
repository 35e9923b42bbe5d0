"""A streaming load generator for generative servers: concurrent clients of OpenAI's completions API.

    stats = measure_streams(url, model, workload, concurrency=4, seconds=60)
    stats.output_tokens_per_s, stats.ttft_ms.p50, stats.itl_ms.p99

Each client sends the workload's requests in turn (`stream: true`, usage included, `ignore_eos`
so every server writes the same number of tokens), keeping `concurrency` streams open. What is
measured is the server at that concurrency, steadily: the window opens once every client's first
answer has begun (until then all of them arrived at once, a burst no steady load has) and closes
`seconds` later, when the clients stop sending; the requests still streaming then run to their end
(a request is never abandoned: its server would go on generating into the next measurement) but,
with fewer streams open, count only up to the close. Measured inside the window: the output tokens
that arrived (a request's tokens by its usage, shared out over its text chunks: a chunk is a
token, or the few a held-back character needed; the tokens of a kept prompt-lookup draft arrive
together), the time to first token of the requests sent (request sent -> first text chunk), and
the gaps between text chunks (inter-token latency, gaps near 0 for a kept draft's); of every
answered request, the tokens prompt lookup drafted, those kept and refused (usage's
completion_tokens_details, OpenAI's accepted / rejected_prediction_tokens; where a server says).
The tokens a second are then those of `concurrency` streams at work, not of the burst at the start
or the last answers' tail at ever fewer streams. What every server here speaks: the kit, the
FastAPI peer (bench/generate/fastapi_peer.py) and llama.cpp's server.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests

TIMEOUT_S = 600
JOIN_S = 0.2  # how soon the main thread sees a Ctrl-C while its clients stream
SERIALS = itertools.count()  # every request's number in this process (Ask.body)


@dataclasses.dataclass(frozen=True)
class Ask:
    """One request of a workload: a prompt and how many tokens to write; with a JSON schema, a chat
    request whose answer must follow it (response_format: the cost of structured output)."""

    prompt: str
    max_tokens: int
    schema: Mapping[str, Any] | None = None

    def url(self, completions: str) -> str:
        """Where it goes, given the server's completions URL: a schema needs chat's."""
        return completions if self.schema is None else completions.removesuffix("completions") + "chat/completions"

    def body(self, model: str, serial: int) -> dict:
        # The request's number in this process opens its prompt: no two prompts of a run share a
        # prefix, so no server answers from what it cached of an earlier one (llama.cpp keeps
        # earlier prompts and reuses a matching prefix), as no server could for users' prompts.
        prompt = f"{serial}. {self.prompt}"
        common = {
            "model": model,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.schema is None:
            return {**common, "prompt": prompt, "ignore_eos": True}
        # The grammar ends the answer (no ignore_eos); the schema keeps it going to max_tokens.
        response_format = {"type": "json_schema", "json_schema": {"name": "bench", "schema": self.schema}}
        return {**common, "messages": [{"role": "user", "content": prompt}], "response_format": response_format}


@dataclasses.dataclass(frozen=True)
class Spread:
    p50: float
    p99: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            return cls(float("nan"), float("nan"))
        ordered = sorted(values)
        return cls(statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))])


@dataclasses.dataclass(frozen=True)
class StreamStats:
    concurrency: int
    seconds: float
    requests: int
    output_tokens: int
    ttft_ms: Spread
    itl_ms: Spread
    errors: int
    first_error: str = ""  # what the first failed request got, to say why a row has errors
    drafts_kept: int = 0  # prompt lookup's drafted tokens kept, as the answers' usage said
    drafts_refused: int = 0

    @property
    def drafts_kept_share(self) -> float | None:
        return self.kept_share(self.drafts_kept, self.drafts_refused)

    @staticmethod
    def kept_share(kept: int, refused: int) -> float | None:
        """The share of drafted tokens kept; None where the server drafted none (or says nothing)."""
        return kept / (kept + refused) if kept + refused else None

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    def summary(self) -> str:
        """One line for a log: what a measurement gave, and why its failed requests failed."""
        text = (
            f"{self.output_tokens_per_s:.1f} tokens/s, TTFT p50 {self.ttft_ms.p50:.0f} ms, "
            f"ITL p50 {self.itl_ms.p50:.0f} ms, {self.errors} errors"
        )
        if (share := self.drafts_kept_share) is not None:
            text += f", {share:.0%} of {self.drafts_kept + self.drafts_refused} drafted tokens kept"
        return text + (f" (the first: {self.first_error[:200]})" if self.errors else "")


@dataclasses.dataclass
class Record:
    started: float
    chunks: list[float] = dataclasses.field(default_factory=list)  # when each text chunk arrived
    tokens: int = 0
    drafts_kept: int = 0
    drafts_refused: int = 0
    error: str = ""

    @property
    def first(self) -> float | None:
        return self.chunks[0] if self.chunks else None

    def tokens_between(self, opened: float, closed: float) -> float:
        """Its tokens that arrived in [opened, closed): the usage's count shared out over its chunks."""
        inside = sum(opened <= at < closed for at in self.chunks)
        return self.tokens * inside / len(self.chunks) if self.chunks else 0.0

    def gaps_between(self, opened: float, closed: float) -> list[float]:
        """The gaps between its chunks that ended in [opened, closed)."""
        return [at - before for before, at in itertools.pairwise(self.chunks) if opened <= at < closed]


def stream_one(session: requests.Session, url: str, body: dict, begun: Callable[[], None] = lambda: None) -> Record:
    """One streamed request; `begun()` as its first text chunk arrives."""
    record = Record(time.perf_counter())
    try:
        with session.post(url, json=body, stream=True, timeout=TIMEOUT_S) as response:
            if response.status_code != 200:
                record.error = f"{response.status_code}: {response.text[:200]}"
                return record
            for line in response.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[len(b"data: ") :])
                now = time.perf_counter()
                if usage := event.get("usage"):
                    record.tokens = int(usage["completion_tokens"])
                    details = usage.get("completion_tokens_details") or {}  # where drafts were made
                    record.drafts_kept = int(details.get("accepted_prediction_tokens") or 0)
                    record.drafts_refused = int(details.get("rejected_prediction_tokens") or 0)
                if any(
                    choice.get("text") or choice.get("delta", {}).get("content")
                    for choice in event.get("choices") or ()
                ):
                    record.chunks.append(now)
                    if len(record.chunks) == 1:
                        begun()
    except (requests.RequestException, ValueError) as error:  # ValueError: an event that is not JSON
        record.error = str(error)
    return record


class Window:
    """The measured window: it opens once each of `clients` has had its first answer begin (or
    end, a failed one), and closes `seconds` later."""

    def __init__(self, clients: int, seconds: float):
        self.seconds = seconds
        self.waiting = set(range(clients))
        self.opened: float | None = None
        self.lock = threading.Lock()

    def begun(self, client: int) -> None:
        with self.lock:
            self.waiting.discard(client)
            if not self.waiting and self.opened is None:
                self.opened = time.perf_counter()

    @property
    def closes(self) -> float:
        return float("inf") if self.opened is None else self.opened + self.seconds


def window_stats(records: Sequence[Record], concurrency: int, opened: float, closed: float) -> StreamStats:
    """What `records` measured in [opened, closed): the tokens and gaps that arrived in it, the
    first tokens of the requests sent in it; requests, errors and drafts of every answered one."""
    done = [r for r in records if not r.error]
    sent = [r for r in done if opened <= r.started < closed]
    return StreamStats(
        concurrency=concurrency,
        seconds=closed - opened,
        requests=len(done),
        output_tokens=round(sum(r.tokens_between(opened, closed) for r in done)),
        ttft_ms=Spread.of([1000 * (r.first - r.started) for r in sent if r.first is not None]),
        itl_ms=Spread.of([1000 * gap for r in done for gap in r.gaps_between(opened, closed)]),
        errors=len(records) - len(done),
        first_error=next((r.error for r in records if r.error), ""),
        drafts_kept=sum(r.drafts_kept for r in done),
        drafts_refused=sum(r.drafts_refused for r in done),
    )


def measure_streams(url: str, model: str, workload: Sequence[Ask], concurrency: int, seconds: float) -> StreamStats:
    """`concurrency` clients streaming the workload: measured for `seconds` once every client's
    first answer has begun (Window)."""
    window = Window(concurrency, seconds)
    records: list[Record] = []
    lock = threading.Lock()
    stopped = threading.Event()  # Ctrl-C: no client sends another request

    def client(offset: int) -> None:
        index = offset
        begun = functools.partial(window.begun, offset)
        while time.perf_counter() < window.closes and not stopped.is_set():
            # A connection per request: llama.cpp's HTTP server closes a kept-alive connection after
            # a few requests, and a request sent as it closes fails with no answer at all.
            try:
                with requests.Session() as session:
                    ask = workload[index % len(workload)]
                    record = stream_one(session, ask.url(url), ask.body(model, next(SERIALS)), begun)
            finally:  # a request that failed, had no text, or ended its client has had its answer too
                begun()
            with lock:
                records.append(record)
            index += concurrency

    # Daemons: on Ctrl-C the bench stops its servers and ends without waiting for the streams in
    # flight (they fail as their server goes), where each client would have gone on asking a
    # stopped server until the deadline.
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():  # in short waits: a join without one defers Ctrl-C to its end
                thread.join(JOIN_S)
    except KeyboardInterrupt:
        stopped.set()
        raise
    assert window.opened is not None  # every client's first request has ended
    return window_stats(records, concurrency, window.opened, window.closes)
