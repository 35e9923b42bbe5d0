"""Serve-time diagnostics switches: set per server through the environment (kit/serve_config.py),
read once by each worker's `initialize` (handlers/base.py; what they do: handlers/diagnostics.py).

    Diagnostics(profile_requests=20).environment()     # {"KIT_PROFILE_REQUESTS": "20"}
    Diagnostics.from_environment()                     # in the worker

Torch-free: the kit's serving side imports it too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

PROFILE_REQUESTS_VAR = "KIT_PROFILE_REQUESTS"
ITT_OPS_VAR = "KIT_ITT_OPS"
WHOLE_JPEG_VAR = "KIT_WHOLE_JPEG_DECODE"
LOG_DIR_VAR = "LOG_LOCATION"  # TorchServe's log directory, set by kit/server.py
STAGES_DIR = "stages"  # in it: each worker's stage histograms


@dataclasses.dataclass(frozen=True)
class Diagnostics:
    profile_requests: int = 0  # record the first N inference calls of each worker
    profile_dir: Path = Path("logs") / "profile"
    itt_ops: bool = False
    # Decode every JPEG whole (handlers/image.py's reduced decoding off): the reference the
    # bench compares phone photos against.
    whole_jpeg_decode: bool = False
    # Where each worker writes its stage histograms (handlers/stages.py): the server's log
    # directory's stages/; None outside a server (kept in memory).
    stages_dir: Path | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Diagnostics:
        raw = environ.get(PROFILE_REQUESTS_VAR, "0")
        if not raw.isdigit():
            raise ValueError(f"{PROFILE_REQUESTS_VAR} must be a whole number of requests, got {raw!r}")
        log_dir = Path(environ.get(LOG_DIR_VAR, "logs"))
        return cls(
            int(raw),
            log_dir / "profile",
            environ.get(ITT_OPS_VAR, "") == "1",
            environ.get(WHOLE_JPEG_VAR, "") == "1",
            log_dir / STAGES_DIR if LOG_DIR_VAR in environ else None,
        )

    def environment(self) -> dict[str, str]:
        """What from_environment reads back (the server sets it; the profile directory follows LOG_LOCATION)."""
        switches = {
            PROFILE_REQUESTS_VAR: str(self.profile_requests) if self.profile_requests else "",
            ITT_OPS_VAR: "1" if self.itt_ops else "",
            WHOLE_JPEG_VAR: "1" if self.whole_jpeg_decode else "",
        }
        return {name: value for name, value in switches.items() if value}
