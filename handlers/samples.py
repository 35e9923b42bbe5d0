"""A model's sample inputs, one object: what int8 calibration, the accuracy guard, the build's
judgement, an int8 repair, the bench and the served accuracy test take.

    samples = handler.samples                # built by OptimizedHandler.load_files
    samples.calibration()                    # batches of one: your calibration samples, else synthetic ones
    samples.held_out(4, size=2)              # held-out batches, never calibrated on
    samples.held_out_body(0)                 # ... as the request body a client sends
    samples.user                             # UserSamples (make model SAMPLES=) or None

Every input is a request body decoded by the handler's own `decode`, so calibration and checks
see exactly what requests become. A model given no samples of its own gets the task's
synthetic bodies (handlers/calibration.py): the first CALIBRATION_COUNT calibrate, the next
ones are held out, those from VALIDATION_START on are an int8 repair's extra validation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from handlers.backends.common import Inputs
from handlers.calibration import CALIBRATION_COUNT
from handlers.payload import InvalidInput

SAMPLES_DIR = "samples"  # in an archive: the user's samples (kit/samples.py), samples/0, samples/1, ...
# Of the user's samples, this share (at least one) is held out for the accuracy guard; the rest calibrate.
HELD_OUT_SHARE = 0.25
MAX_CALIBRATION = 128  # NNCF's and PT2E's observers settle well before; more only slows the build
# Synthetic bodies from here on are neither calibration nor held-out ones: an int8 repair of a
# model given no samples validates on them (handlers/precompile.py).
VALIDATION_START = 1000


@dataclasses.dataclass(frozen=True)
class UserSamples:
    """The request bodies an archive carries, split into calibration and held-out ones."""

    calibration: list[bytes]
    held_out: list[bytes]

    @classmethod
    def load(cls, model_dir: Path) -> UserSamples | None:
        directory = Path(model_dir) / SAMPLES_DIR
        if not directory.is_dir():
            return None
        bodies = [p.read_bytes() for p in sorted(directory.iterdir(), key=lambda p: int(p.name))]
        held = max(1, round(len(bodies) * HELD_OUT_SHARE))
        return cls(bodies[:-held][:MAX_CALIBRATION], bodies[-held:])


@dataclasses.dataclass(frozen=True)
class Samples:
    """The user's samples, else the task's synthetic bodies, decoded and batched as requests are."""

    decode: Callable[[bytes], Inputs]  # one body -> unbatched input tensors (the handler's decode)
    collate: Callable[[Sequence[Inputs], int], Inputs]  # decoded items -> one batch of a bucket's size
    synthetic_body: Callable[[int], bytes]  # the task's representative body number i
    user: UserSamples | None = None

    def synthetic(self, index: int) -> Inputs:
        return self.decode(self.synthetic_body(index))

    def given(self, body: bytes) -> Inputs:
        """One of the user's samples, decoded; a sample a request could not be is named as such."""
        try:
            return self.decode(body)
        except InvalidInput as error:
            raise InvalidInput(f"a sample given with SAMPLES= cannot be served: {error}") from None

    def calibration_bodies(self) -> list[bytes]:
        if self.user:
            return list(self.user.calibration)
        return [self.synthetic_body(index) for index in range(CALIBRATION_COUNT)]

    def calibration(self) -> list[Inputs]:
        """What int8 calibration sees, one sample per batch."""
        decode = self.given if self.user else self.decode
        return [self.collate([decode(body)], 1) for body in self.calibration_bodies()]

    def held_out_body(self, index: int) -> bytes:
        """A body calibration never saw (the user's repeat when there are fewer than asked for)."""
        if self.user:
            return self.user.held_out[index % len(self.user.held_out)]
        return self.synthetic_body(CALIBRATION_COUNT + index)

    def held_out_sample(self, index: int) -> Inputs:
        body = self.held_out_body(index)
        return self.given(body) if self.user else self.decode(body)

    def held_out(self, batches: int, size: int = 1) -> list[Inputs]:
        """Held-out samples in batches: for the accuracy guard and the build's and bench's agreement."""
        return [self.collate([self.held_out_sample(b * size + i) for i in range(size)], size) for b in range(batches)]

    def checks(self, size: int, batches: int = 4) -> list[Inputs]:
        """The worker's accuracy guard inputs: held-out samples in full batches of `size`."""
        return self.held_out(batches, size)

    def validation_extra(self, count: int) -> list[Inputs]:
        """For a model given no samples, synthetic batches of one beyond calibration and held-out
        ones, for an int8 repair to validate on; none when the user gave samples."""
        if self.user:
            return []
        return [self.collate([self.synthetic(VALIDATION_START + i)], 1) for i in range(count)]
