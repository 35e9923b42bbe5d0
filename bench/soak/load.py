"""Closed-loop HTTP load that records every request: what the soak and kill checks read.

    with ClosedLoop(server, [Request("resnet50", jpeg, "image/jpeg")], concurrency=8) as load:
        time.sleep(60)
    samples = load.samples          # one Sample per request: start, end, status

ab reports totals; a fault test needs each request's time and outcome (which ones failed
while a worker was down, how long the service took to come back), hence this client.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Sequence

import requests

from kit.server import Server

NO_RESPONSE = 0  # status of a request that got no HTTP answer (connection error, timeout)


@dataclasses.dataclass(frozen=True)
class Request:
    model: str
    body: bytes
    content_type: str


@dataclasses.dataclass(frozen=True)
class Sample:
    model: str
    start: float  # time.monotonic() when sent
    end: float  # when the answer (or the error) arrived
    status: int  # HTTP status, NO_RESPONSE if none
    error: str = ""  # the body of a non-200, or the client-side exception

    @property
    def ok(self) -> bool:
        return self.status == 200


def send(session: requests.Session, server: Server, request: Request, timeout_s: float = 60) -> Sample:
    url = server.api.url("inference", f"/predictions/{request.model}")
    headers = {"Content-Type": request.content_type, **server.api.headers("inference")}
    start = time.monotonic()
    try:
        response = session.post(url, data=request.body, headers=headers, timeout=timeout_s)
    except requests.RequestException as error:
        return Sample(request.model, start, time.monotonic(), NO_RESPONSE, f"{type(error).__name__}: {error}")
    return Sample(request.model, start, time.monotonic(), response.status_code, "" if response.ok else response.text)


class ClosedLoop:
    """`concurrency` clients, each sending its next request as soon as the last one returned."""

    def __init__(self, server: Server, mix: Sequence[Request], concurrency: int, timeout_s: float = 60):
        self.server = server
        self.mix = list(mix)
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> ClosedLoop:
        self._threads = [
            threading.Thread(target=self._client, args=(offset,), daemon=True) for offset in range(self.concurrency)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s + 5)

    def _client(self, offset: int) -> None:
        session = requests.Session()  # keep-alive, like ab -k
        # Each client starts at a different point of the mix, so models interleave.
        for request in itertools.islice(itertools.cycle(self.mix), offset % len(self.mix), None):
            if self._stop.is_set():
                return
            sample = send(session, self.server, request, self.timeout_s)
            with self._lock:
                self.samples.append(sample)
