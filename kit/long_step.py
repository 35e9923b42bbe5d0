"""A long step run by another program (a build, an environment, an export): its output in a log
file, its time printed, and the log's end shown when it fails.

    lines = run(["cmake", ...], "building llama-server", build / "build.log", say=log)
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class StepFailed(RuntimeError):
    """A step that exited non-zero: its exit code (a program may say why by it) and its log's end."""

    def __init__(self, what: str, returncode: int, log_file: Path, lines: list[str]):
        self.returncode = returncode
        self.last_line = lines[-1] if lines else ""
        tail = "\n".join(lines[-15:])
        super().__init__(f"{what} failed (exit {returncode}); the end of {log_file}:\n{tail}")


def run(command: list[str], what: str, log_file: Path, say: Callable[[str], None], **options) -> list[str]:
    """The command run to its end, its output in `log_file`; the output's lines."""
    started = time.monotonic()
    say(f"{what} (log: {log_file})")
    with open(log_file, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **options)
    lines = log_file.read_text(errors="replace").strip().splitlines()
    if done.returncode != 0:
        raise StepFailed(what, done.returncode, log_file, lines)
    say(f"{what}: done in {time.monotonic() - started:.0f} s")
    return lines
