"""kit/ports.py: ports outside the ephemeral range, never handed out twice, busy ones skipped, a
lost port retried on fresh ones."""

from __future__ import annotations

import socket

import pytest

from kit.ports import (
    HIGHEST_PORT,
    LOWEST_PORT,
    START_ATTEMPTS,
    PortInUseError,
    PortPool,
    bind_failure,
    is_free,
    read_ephemeral_range,
    start_on_fresh_ports,
)

LINUX_DEFAULT = range(32768, 61000)  # 32768-60999, what this VM's /proc says


def test_ports_are_distinct_free_and_outside_the_ephemeral_range():
    pool = PortPool(ephemeral=LINUX_DEFAULT)
    taken = [port for _ in range(40) for port in pool.take(5)]  # 40 servers' worth
    assert len(set(taken)) == len(taken) == 200
    assert all(LOWEST_PORT <= port <= HIGHEST_PORT and port not in LINUX_DEFAULT for port in taken)
    assert all(is_free(port) for port in taken)


def test_a_busy_port_is_skipped(monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # loopback only: the wildcard check must still see it
        holder.listen()
        busy = holder.getsockname()[1]
        assert not is_free(busy)
        pool = PortPool(ephemeral=LINUX_DEFAULT)
        free = PortPool(ephemeral=LINUX_DEFAULT).take(1)[0]
        draws = iter([busy, busy, free])
        monkeypatch.setattr(pool, "draw", lambda: next(draws))
        assert pool.take(1) == [free]


def test_a_port_is_never_handed_out_twice(monkeypatch):
    pool = PortPool(ephemeral=LINUX_DEFAULT)
    first, second = PortPool(ephemeral=LINUX_DEFAULT).take(2)
    draws = iter([first, first, first, second])
    monkeypatch.setattr(pool, "draw", lambda: next(draws))
    assert pool.take(2) == [first, second]


def test_no_free_port_is_an_error_naming_the_fix(monkeypatch):
    pool = PortPool(ephemeral=LINUX_DEFAULT)
    monkeypatch.setattr("kit.ports.is_free", lambda port: False)
    with pytest.raises(PortInUseError, match=r"found 0 of 2 free ports .* narrow the ephemeral range"):
        pool.take(2)


def test_a_machine_whose_ephemeral_range_covers_everything_takes_any_port():
    assert PortPool(ephemeral=range(1024, 65536)).candidates() == [range(LOWEST_PORT, HIGHEST_PORT + 1)]
    assert PortPool(ephemeral=LINUX_DEFAULT).candidates() == [range(LOWEST_PORT, 32768), range(61000, HIGHEST_PORT + 1)]


def test_the_ephemeral_range_is_read_from_proc(tmp_path):
    path = tmp_path / "ip_local_port_range"
    path.write_text("32768\t60999\n")
    assert read_ephemeral_range(path) == LINUX_DEFAULT
    assert len(read_ephemeral_range()) > 0  # this machine's


@pytest.mark.parametrize(
    "log, line",
    [
        # TorchServe 0.12's gRPC and HTTP servers, as they printed it here:
        (
            "x\njava.io.IOException: Failed to bind to address /127.0.0.1:56545\n\tat io.grpc...\nCaused by: ... "
            "bind(..) failed: Address already in use\n",
            "java.io.IOException: Failed to bind to address /127.0.0.1:56545",
        ),
        (
            "java.io.IOException: Failed to bind to address: http://127.0.0.1:53925\n",
            "java.io.IOException: Failed to bind to address: http://127.0.0.1:53925",
        ),
        # uvicorn (the served peers):
        (
            "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use\n",
            "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use",
        ),
        ("Torchserve stopped.\nUnrecognized VM option 'X'\n", ""),
    ],
)
def test_a_lost_port_is_read_from_the_servers_log(log, line):
    assert bind_failure(log) == line


class FakeServer:
    """Records start/stop; its ready() fails as told (a PortInUseError is a lost port)."""

    def __init__(self, failure: Exception | None, log_dir):
        self.failure, self.events = failure, []
        self.log_dir = log_dir

    def start(self):
        self.log_dir.mkdir(exist_ok=True)
        (self.log_dir / "torchserve.out").write_text(f"attempt with {self.failure!r}")
        self.events.append("start")

    def ready(self):
        if self.failure:
            raise self.failure

    def stop(self):
        self.events.append("stop")


def servers_failing_with(failures: list, log_dir, made: list[FakeServer]):
    """A `new` for start_on_fresh_ports: each call makes the next FakeServer, failing as listed."""
    pending = iter(failures)

    def new() -> FakeServer:
        made.append(FakeServer(next(pending), log_dir))
        return made[-1]

    return new


def test_a_start_that_lost_a_port_is_done_again_and_its_log_kept(tmp_path):
    run_dir, made, messages = tmp_path / "run", [], []
    new = servers_failing_with([PortInUseError("port 43459 taken"), None], run_dir, made)
    server = start_on_fresh_ports(new, FakeServer.ready, keep=run_dir, progress=messages.append)
    assert server is made[1] and made[0].events == ["start", "stop"] and made[1].events == ["start"]
    kept = tmp_path / "run.attempt-1" / "torchserve.out"
    assert "port 43459 taken" in kept.read_text()
    assert "port 43459 taken" not in (run_dir / "torchserve.out").read_text()
    assert len(messages) == 1 and "starting again on fresh ports (attempt 2 of 3" in messages[0]


def test_a_port_lost_every_time_gives_up_after_the_last_attempt(tmp_path):
    made: list[FakeServer] = []
    new = servers_failing_with([PortInUseError("taken")] * START_ATTEMPTS, tmp_path / "run", made)
    with pytest.raises(PortInUseError, match="taken"):
        start_on_fresh_ports(new, FakeServer.ready, keep=tmp_path / "run", progress=lambda message: None)
    assert len(made) == START_ATTEMPTS and all(server.events == ["start", "stop"] for server in made)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"run.attempt-{n}" for n in range(1, START_ATTEMPTS + 1)]


def test_any_other_failure_is_not_retried_and_the_server_is_stopped(tmp_path):
    made: list[FakeServer] = []
    new = servers_failing_with([RuntimeError("model load failed")], tmp_path / "run", made)
    with pytest.raises(RuntimeError, match="model load failed"):
        start_on_fresh_ports(new, FakeServer.ready, keep=tmp_path / "run", progress=lambda message: None)
    assert len(made) == 1 and made[0].events == ["start", "stop"]
    assert (tmp_path / "run").is_dir()  # nothing moved: the failure is the run's own


def test_the_last_port_torchserve_refuses_is_never_handed_out():
    """TorchServe's frontend refuses port 65535 ("Invalid port number"): the pool's candidates
    above the ephemeral range end below it."""
    pool = PortPool(ephemeral=LINUX_DEFAULT)
    assert max(r.stop - 1 for r in pool.candidates()) == HIGHEST_PORT == 65534
