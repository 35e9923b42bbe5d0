"""One Intel ITT range per inference call, so a VTune timeline shows each request batch.

    with inference_range("resnet50", batch_size=4, enabled=True):
        logits = model(x)

Without a collector attached, the ITT push/pop calls are stubs inside libittnotify: cheap
enough to leave on in production.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.profiler import itt


def range_name(model_name: str, batch_size: int) -> str:
    return f"{model_name}:bs{batch_size}"


def parse_range_name(name: str) -> tuple[str, int] | None:
    """range_name's inverse: (model, batch size), or None for another range."""
    model, _, batch = name.rpartition(":bs")
    return (model, int(batch)) if model and batch.isdigit() else None


@contextlib.contextmanager
def inference_range(model_name: str, batch_size: int, enabled: bool) -> Iterator[None]:
    if not (enabled and itt.is_available()):
        yield
        return
    itt.range_push(range_name(model_name, batch_size))
    try:
        yield
    finally:
        # Popped even when inference raises, so ranges never nest across requests.
        itt.range_pop()
