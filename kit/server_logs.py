"""What a server's run directory and its memory cgroup say about why it did not start or died.

logs = RunLogs(run_dir); logs.mark()        # at start: later reads see only this run's lines
logs.load_failures()                        # lines that mean a worker could not load its model
logs.exit_reason(); logs.tail(logs.model_log)
OomWatch.at_start().note()                  # "" or: the kernel's OOM killer killed N processes ...
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from kit.cgroup import cgroup_memory_limit, oom_kills
from kit.topology import gib

# The line of TorchServe's output that says why it stopped: the JVM's refusal of an option
# ("Unrecognized VM option ..."), a Java exception, the CLI's own "... not found".
EXIT_REASON = re.compile(r"^(Unrecognized|Invalid|Error)\b|^[\w.$]+(Exception|Error): ")


def wait_until_unchanged(path: Path, quiet_s: float = 1.0, limit_s: float = 10.0) -> None:
    """Return once `path` has not grown for quiet_s seconds, or after limit_s at most."""
    deadline = time.monotonic() + limit_s
    size, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_size = path.stat().st_size if path.is_file() else 0
        if now_size != size:
            size, since = now_size, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)


class RunLogs:
    """TorchServe's output and logs in one run directory; they append across runs, so start-up
    checks read only what was written since `mark()`."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}

    @property
    def output_file(self) -> Path:
        return self.run_dir / "torchserve.out"

    @property
    def frontend_log(self) -> Path:
        return self.run_dir / "ts_log.log"

    @property
    def model_log(self) -> Path:
        return self.run_dir / "model_log.log"

    # Frontend log lines that mean a worker could not start or load its model. TorchServe would
    # retry with growing back-off for ever; start-up gives up at the first one instead.
    @property
    def failure_markers(self) -> dict[Path, tuple[str, ...]]:
        """Lines that mean a worker failed to load, per log. The frontend's "Load model failed" is
        not always written (TorchServe 0.12 sometimes logs only its auto-recovery after a worker
        raised in initialize); the worker's own "Failed to load model" names the reason each time."""
        return {
            self.frontend_log: ("Load model failed", "Backend worker process died"),
            self.model_log: ("Failed to load model",),
        }

    def mark(self) -> None:
        """From now on, reads start at the files' present ends."""
        self.offsets = {
            path: path.stat().st_size if path.is_file() else 0 for path in [*self.failure_markers, self.output_file]
        }

    def load_failures(self) -> list[str]:
        failures = []
        for path, markers in self.failure_markers.items():
            if not path.is_file():
                continue
            offset = self.offsets.get(path, 0)
            with open(path, "rb") as log:
                log.seek(offset if log.seek(0, 2) >= offset else 0)  # 0 after a roll-over
                lines = log.read().decode(errors="replace").splitlines()
            failures += [line for line in lines if any(marker in line for marker in markers)]
        return failures

    def output_since_start(self) -> str:
        """What TorchServe printed since the last mark (the output file appends across starts)."""
        if not self.output_file.is_file():
            return ""
        with open(self.output_file, "rb") as output:
            output.seek(self.offsets.get(self.output_file, 0))
            return output.read().decode(errors="replace")

    def exit_reason(self) -> str:
        lines = [line.strip() for line in self.output_since_start().splitlines() if line.strip()]
        return next((line for line in lines if EXIT_REASON.search(line)), lines[-1] if lines else "no output")

    def tail(self, path: Path | None = None, lines: int = 30) -> str:
        path = path or self.output_file
        if not path.is_file():
            return f"({path} does not exist)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclasses.dataclass(frozen=True)
class OomWatch:
    """The OOM killer's count in the server's memory cgroup at its start, to say why workers died
    once they are gone: TorchServe reports only "Worker died" (exit 137) and starts another."""

    cgroup: str | None = None  # /proc/PID/cgroup of the server (its workers inherit it)
    kills_at_start: int | None = None

    @classmethod
    def at_start(cls) -> OomWatch:
        cgroup = Path("/proc/self/cgroup").read_text()  # the server and its workers inherit it
        return cls(cgroup, oom_kills(cgroup))

    def kills(self) -> int | None:
        """The OOM killer's count in the cgroup now; None where unknown."""
        return None if self.cgroup is None else oom_kills(self.cgroup)

    def note(self) -> str:
        """Why workers died, when the kernel says it killed them for memory; "" otherwise."""
        now, before = self.kills(), self.kills_at_start
        if now is None or before is None or now == before:
            return ""
        limit = cgroup_memory_limit(self.cgroup)
        return (
            f"the kernel's OOM killer killed {now - before} process(es) of this server since it started "
            f"(memory limit {gib(limit) if limit else 'none'}): give it more memory, serve fewer models or "
            "workers (`make serve MEMORY=...` fits the workers into a budget), or a smaller variant "
            "(openvino-int8 holds about half of inductor's)"
        )
