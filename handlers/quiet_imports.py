"""Third-party loggers that say what does not apply to the kit's use of them, made quiet.

    with torchao_import():                     # around an import that brings torchao in
        from transformers import BertModel
    with loggers_at(logging.WARNING, "nncf"):  # around a call whose INFO lines say nothing to a user
        nncf.quantize(...)

torchao 0.18 under the CPU build of torch logs two warnings that mean nothing here, which
every `make archive` and every text worker printed:
- "Failed to load .../torchao/_C_cutlass_90a.abi3.so" (and _C_mxfp8): kernel libraries for CUDA
  (sm_90a) and another Python; the kit's int8 path (PT2E + Inductor) uses none of them.
- torch/utils/_pytree.py "<enum 'KernelPreference'> is an Enum subclass ... register_constant()
  is deprecated": torchao registers two enums the old way; torch still accepts it.
transformers imports torchao whenever it is installed (its torchao quantizer), so BERT and
MiniLM workers import it too. Only those loggers, only during the import: later warnings show.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

NOISY_AT_IMPORT = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def loggers_at(level: int, *names: str) -> Iterator[None]:
    """The named loggers log only at `level` and above inside the block, as before after it."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, before in zip(loggers, levels, strict=True):
            logger.setLevel(before)


def torchao_import() -> contextlib.AbstractContextManager[None]:
    return loggers_at(logging.ERROR, *NOISY_AT_IMPORT)
