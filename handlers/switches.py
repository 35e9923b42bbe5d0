"""Serve-time diagnostics switches: chosen per server (ServeConfig.diagnostics, kit/serve_config.py),
passed to its workers through the environment, read once by each worker's `initialize`
(handlers/base.py; what they do: handlers/diagnostics.py).

    Diagnostics(profile_requests=20).environment()     # {"KIT_PROFILE_REQUESTS": "20"}
    Diagnostics.from_environment()                     # in the worker
    WorkerDirs.from_environment().stages              # where it writes its stage histograms
    model_settings_environment({"lm": {"prompt_lookup": 4}}); served_settings("lm")   # {"prompt_lookup": 4}

Torch-free: the kit's serving side imports it too.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from handlers.typed_config import SettingsError

PROFILE_REQUESTS_VAR = "KIT_PROFILE_REQUESTS"
ITT_OPS_VAR = "KIT_ITT_OPS"
WHOLE_JPEG_VAR = "KIT_WHOLE_JPEG_DECODE"
NO_STAGE_METRICS_VAR = "KIT_NO_STAGE_METRICS"
LOG_DIR_VAR = "LOG_LOCATION"  # TorchServe's log directory, set by kit/server.py
STAGES_DIR = "stages"  # in it: each worker's stage histograms
# Set by kit/pin_worker.py from the plan: the sequences a language model's worker generates at
# once (its archive's max_sequences, or the preset's model_sequences).
PLANNED_SEQUENCES_VAR = "KIT_MAX_SEQUENCES"
# And the contexts of KV cache its sequences share: as many, fewer when memory holds no more.
PLANNED_KV_CONTEXTS_VAR = "KIT_KV_CONTEXTS"
# Set by kit/properties.py from the preset's model_settings: per model, handler settings served
# over its archive's ({"lm": {"prompt_lookup": 4}}, JSON), the ones a worker reads as it starts.
MODEL_SETTINGS_VAR = "KIT_MODEL_SETTINGS"


@dataclasses.dataclass(frozen=True)
class Diagnostics:
    """What a server switches on in its workers (a preset's or bench row's `diagnostics:`)."""

    profile_requests: int = 0  # a profiler trace of each worker's first N inference calls
    itt_ops: bool = False  # op-level ITT ranges (VTune), beside the one range per call
    # Decode every JPEG whole (handlers/image.py's reduced decoding off): the reference the
    # bench compares phone photos against.
    whole_jpeg_decode: bool = False
    # The stage clock and request counts (handlers/stages.py, the metrics port's kit_stage_* and
    # kit_requests_total): off only to measure what they cost (make bench PLAN=metrics).
    stage_metrics: bool = True

    def __post_init__(self) -> None:
        if self.profile_requests < 0:
            raise SettingsError(f"profile_requests must be >= 0, got {self.profile_requests}")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Diagnostics:
        raw = environ.get(PROFILE_REQUESTS_VAR, "0")
        if not raw.isdigit():
            raise ValueError(f"{PROFILE_REQUESTS_VAR} must be a whole number of requests, got {raw!r}")
        return cls(
            int(raw),
            environ.get(ITT_OPS_VAR, "") == "1",
            environ.get(WHOLE_JPEG_VAR, "") == "1",
            environ.get(NO_STAGE_METRICS_VAR, "") != "1",
        )

    def environment(self) -> dict[str, str]:
        """What from_environment reads back (the server sets it for every worker)."""
        switches = {
            PROFILE_REQUESTS_VAR: str(self.profile_requests) if self.profile_requests else "",
            ITT_OPS_VAR: "1" if self.itt_ops else "",
            WHOLE_JPEG_VAR: "1" if self.whole_jpeg_decode else "",
            NO_STAGE_METRICS_VAR: "" if self.stage_metrics else "1",
        }
        return {name: value for name, value in switches.items() if value}


@dataclasses.dataclass(frozen=True)
class WorkerDirs:
    """Where a worker writes what it records: under the server's log directory."""

    profile: Path = Path("logs") / "profile"
    # Each worker's stage histograms (handlers/stages.py); None outside a server (kept in memory).
    stages: Path | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> WorkerDirs:
        if LOG_DIR_VAR not in environ:
            return cls()
        log_dir = Path(environ[LOG_DIR_VAR])
        return cls(log_dir / "profile", log_dir / STAGES_DIR)


def planned_sequences(environ: Mapping[str, str] = os.environ) -> int | None:
    """The plan's number of sequences for this worker; None when it set none."""
    return _planned(environ, PLANNED_SEQUENCES_VAR, "sequences")


def planned_kv_contexts(environ: Mapping[str, str] = os.environ) -> int | None:
    """The plan's KV cache for this worker, in whole contexts; None when it set none."""
    return _planned(environ, PLANNED_KV_CONTEXTS_VAR, "contexts")


def _planned(environ: Mapping[str, str], name: str, what: str) -> int | None:
    raw = environ.get(name)
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name} must be a number of {what} >= 1, got {raw!r}")
    return int(raw)


def model_settings_environment(settings: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """What served_settings reads back in each model's workers (the server sets it for all)."""
    return (
        {MODEL_SETTINGS_VAR: json.dumps({model: dict(values) for model, values in settings.items()})}
        if settings
        else {}
    )


def served_settings(model: str, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The handler settings the server serves `model` with over its archive's; {} when none."""
    raw = environ.get(MODEL_SETTINGS_VAR)
    return dict(json.loads(raw).get(model, {})) if raw else {}
