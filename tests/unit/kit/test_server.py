"""When a stop may kill TorchServe's frontend early: a real process, its real sockets."""

import os
import subprocess
import sys

import psutil

from kit.server import closed_frontend


def test_a_frontend_is_closed_once_it_listens_on_no_port(tmp_path):
    java = tmp_path / "java"  # the name the process runs as, as TorchServe's frontend
    java.symlink_to(sys.executable)
    listening = (
        "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
        "print('ready', flush=True); sys.stdin.readline(); s.close(); print('closed', flush=True); sys.stdin.readline()"
    )
    frontend = subprocess.Popen([str(java), "-c", listening], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert frontend.stdout.readline().strip() == "ready"
        assert not closed_frontend(psutil.Process(frontend.pid))
        frontend.stdin.write("\n")
        frontend.stdin.flush()
        assert frontend.stdout.readline().strip() == "closed"
        assert closed_frontend(psutil.Process(frontend.pid))
        assert not closed_frontend(psutil.Process(os.getpid()))  # not a frontend: never killed early
    finally:
        frontend.kill()
