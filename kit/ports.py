"""Ports for the servers the kit starts for itself: bench rows, `make tune`, soak, tests, served peers.

    inference, management = PORTS.take(2)     # distinct, free now, outside the ephemeral range

Binding to port 0 hands out a port from the kernel's ephemeral range
(/proc/sys/net/ipv4/ip_local_port_range), the range every outgoing connection takes its source
port from (ab, readiness polls, the frontend's own connections): two such calls may return the
same port, and a connection may take it in the seconds before the JVM binds it. Ports here come
from outside that range, are never handed out twice by one process, and are checked free; a
start that still loses one to another process fails with `PortInUseError`, and the caller
starts again on fresh ports (kit.server.start_ready).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

# TorchServe's own defaults: what `make serve` and the container's auth proxy publish, and what
# clients, docs and deploy/k8s's manifests expect. Servers the kit starts for itself take pool ports.
INFERENCE_PORT, MANAGEMENT_PORT, METRICS_PORT = 8080, 8081, 8082
GRPC_INFERENCE_PORT, GRPC_MANAGEMENT_PORT = 7070, 7071
# The one OpenAI base URL (kit/openai_router.py): vLLM's port, where OpenAI clients are often pointed.
OPENAI_PORT = 8000

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000  # below: ports that services and users pick by hand (8080, 9000, 5432, ...)
# TorchServe refuses 65535 itself ("Invalid configuration: Invalid port number: http://127.0.0.1:65535":
# its frontend takes ports below 65535), and a server the kit started there never came up.
HIGHEST_PORT = 65534
# Fewer ports than this outside the ephemeral range (a machine that widened it): take any port.
MIN_CANDIDATES = 1000
TRIES_PER_PORT = 200  # random draws before giving up: each draw is checked free, so a busy machine needs a few
# What a server that lost a port prints: Java (TorchServe's HTTP and gRPC servers) and Python
# (uvicorn: "[Errno 98] ... address already in use").
BIND_FAILURE = re.compile(r"failed to bind|address already in use", re.IGNORECASE)


class PortInUseError(RuntimeError):
    """A server could not bind a port it was given: another process took it first."""


def read_ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> range:
    low, high = map(int, path.read_text().split())
    return range(low, high + 1)


def is_free(port: int) -> bool:
    """Whether `port` can be bound on every IPv4 address now (a wildcard bind fails when any
    address holds the port, so this also covers servers bound to loopback only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@dataclasses.dataclass
class PortPool:
    """Hands out ports that no other call of this process got, free when handed out."""

    ephemeral: range | None = None  # None: read from /proc when first needed
    rng: random.Random = dataclasses.field(default_factory=random.SystemRandom)
    handed_out: set[int] = dataclasses.field(default_factory=set)

    def candidates(self) -> list[range]:
        if self.ephemeral is None:
            self.ephemeral = read_ephemeral_range()
        outside = [range(LOWEST_PORT, self.ephemeral.start), range(self.ephemeral.stop, HIGHEST_PORT + 1)]
        outside = [r for r in outside if len(r) > 0]
        return outside if sum(map(len, outside)) >= MIN_CANDIDATES else [range(LOWEST_PORT, HIGHEST_PORT + 1)]

    def draw(self) -> int:
        ranges = self.candidates()
        # Uniform over all candidates: pick a range by its size, then a port in it.
        chosen = self.rng.choices(ranges, weights=[len(r) for r in ranges])[0]
        return self.rng.choice(chosen)

    def take(self, count: int) -> list[int]:
        ports: list[int] = []
        for _ in range(count * TRIES_PER_PORT):
            if len(ports) == count:
                break
            port = self.draw()
            if port not in self.handed_out and is_free(port):
                self.handed_out.add(port)
                ports.append(port)
        if len(ports) < count:
            raise PortInUseError(
                f"found {len(ports)} of {count} free ports in {self.candidates()} after {count * TRIES_PER_PORT} "
                f"tries; stop what holds them, or narrow the ephemeral range {EPHEMERAL_RANGE_FILE}"
            )
        return ports


PORTS = PortPool()  # the one pool of this process: every server the kit starts takes its ports here


def bind_failure(log_text: str) -> str:
    """The first line of a server's log that says a bind failed ("" if none). TorchServe's names
    the port: "java.io.IOException: Failed to bind to address /127.0.0.1:43459"."""
    for line in log_text.splitlines():
        if BIND_FAILURE.search(line):
            return line.strip()
    return ""


START_ATTEMPTS = 3  # a second loss in a row is already rare: a third means something holds ports on purpose


class Startable(Protocol):
    def start(self) -> object: ...
    def stop(self) -> None: ...


S = TypeVar("S", bound=Startable)


def keep_attempt(path: Path, number: int) -> Path:
    """Move a failed start's run directory or log aside (`<name>.attempt-<n><suffix>`), so the
    next attempt starts clean and the failed one can still be read."""
    kept = path.with_name(f"{path.stem}.attempt-{number}{path.suffix}")
    if kept.is_dir():
        shutil.rmtree(kept)
    if path.exists():
        path.rename(kept)
    return kept


def start_on_fresh_ports(new: Callable[[], S], ready: Callable[[S], None], keep: Path, progress=print) -> S:
    """Start `new()` (a server on ports just taken from PORTS) and wait with `ready`; a start that
    lost a port (PortInUseError) is stopped, its log kept, and done again on fresh ports."""
    for number in itertools.count(1):
        server = new()
        server.start()
        try:
            ready(server)
            return server
        except PortInUseError as error:
            server.stop()
            kept = keep_attempt(keep, number)
            if number == START_ATTEMPTS:
                raise
            progress(
                f"[ports] {error}; starting again on fresh ports (attempt {number + 1} of "
                f"{START_ATTEMPTS}; the failed start's log: {kept})"
            )
        except BaseException:
            server.stop()
            raise
