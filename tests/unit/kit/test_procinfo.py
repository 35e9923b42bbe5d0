"""The allocator check reads the real /proc/PID/maps of a real process; stops stop real processes."""

import os
import signal
import subprocess
import sys

import psutil
import pytest

from kit.procinfo import ended, inspect_process, loaded_allocator, terminate
from kit.variant import Variant

VENV = Variant.load("inductor").environment  # the main environment, with its allocator links

SLEEPER = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"]


def start(env_extra: dict[str, str]) -> subprocess.Popen:
    process = subprocess.Popen(SLEEPER, env={**os.environ, **env_extra}, stdout=subprocess.PIPE, text=True)
    # Once Python prints, ld.so has long mapped every preloaded library.
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
def test_preloaded_allocator_is_seen_in_maps(allocator):
    library = VENV / "lib" / f"lib{allocator}.so"
    assert library.exists(), f"{library} missing: `make install` links it for the launcher"
    process = start({"LD_PRELOAD": str(library)})
    try:
        assert loaded_allocator(process.pid) == allocator
    finally:
        process.kill()
        process.wait()


def test_plain_process_uses_default_allocator():
    process = start({"LD_PRELOAD": ""})
    try:
        info = inspect_process(process.pid)
        assert info.allocator == "default"
        assert info.cpus == tuple(sorted(os.sched_getaffinity(0)))
        assert info.rss_mb > 0
    finally:
        process.kill()
        process.wait()


# A process that ignores SIGTERM until killed, as TorchServe's frontend waits out netty's quiet period.
LINGERER = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)",
]


def started(command: list[str]) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"  # its SIGTERM handler is set
    return process


def test_terminate_kills_what_only_waits_to_exit_once_the_rest_is_gone():
    lingerer, worker = started(LINGERER), start({})
    try:
        processes = [psutil.Process(lingerer.pid), psutil.Process(worker.pid)]
        terminate(processes, 60, idle=lambda p: p.pid == lingerer.pid)
        # Reaped by terminate (Popen.wait would say 0): psutil kept how each ended.
        assert processes[1].wait(0) == -signal.SIGTERM  # the rest went by itself
        assert processes[0].wait(0) == -signal.SIGKILL  # not left to its 60 s
    finally:
        lingerer.kill()
        worker.kill()


def test_terminate_leaves_the_idle_until_the_rest_is_gone():
    slow = [  # finishes its work for half a second after SIGTERM, then exits 3
        sys.executable,
        "-c",
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), sys.exit(3)))\n"
        "print('ready', flush=True)\ntime.sleep(60)",
    ]
    lingerer, worker = started(LINGERER), started(slow)
    try:
        processes = [psutil.Process(lingerer.pid), psutil.Process(worker.pid)]
        terminate(processes, 60, idle=lambda p: p.pid == lingerer.pid)
        assert processes[1].wait(0) == 3  # not killed with the idle one: it finished
        assert processes[0].wait(0) == -signal.SIGKILL
    finally:
        lingerer.kill()
        worker.kill()


def test_a_process_that_ends_between_the_two_looks_has_ended():
    """Still running when waited on, gone when its status is read: ended, not an error (a stop in a
    CI run raised NoSuchProcess from there)."""

    class EndsBetween:
        pid = 123

        def wait(self, timeout):
            raise psutil.TimeoutExpired(timeout, self.pid)

        def status(self):
            raise psutil.NoSuchProcess(self.pid)

    assert ended(EndsBetween())
