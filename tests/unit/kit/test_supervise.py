"""kit/supervise.py: what ends the container's watch, said by name."""

from __future__ import annotations

import subprocess
import sys
import types

from kit.supervise import watch


def exited() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_router_that_exits_ends_the_watch_naming_it_and_its_log(tmp_path):
    server = types.SimpleNamespace(is_running=lambda: True, router_pid=exited(), run_dir=tmp_path)
    assert watch(server, None) == f"the OpenAI router exited; see {tmp_path / 'openai_router.out'}"


def test_a_proxy_that_exits_ends_the_watch_first():
    proxy = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proxy.wait()
    server = types.SimpleNamespace(is_running=lambda: True, router_pid=None)
    assert watch(server, proxy) == "the auth proxy (nginx) exited with status 3"
