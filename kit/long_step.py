"""A long step run by another program (a build, an environment, an export): its output in a log
file, its time printed, and the log's end shown when it fails.

    run(["cmake", ...], "building llama-server", build / "build.log", say=log)
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def run(command: list[str], what: str, log_file: Path, say: Callable[[str], None], **options) -> None:
    started = time.monotonic()
    say(f"{what} (log: {log_file})")
    with open(log_file, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **options)
    if done.returncode != 0:
        tail = "".join(log_file.read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"{what} failed (exit {done.returncode}); the end of {log_file}:\n{tail}")
    say(f"{what}: done in {time.monotonic() - started:.0f} s")
