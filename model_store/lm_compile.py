"""`python -m model_store.lm_compile STAGING NAME SETTINGS`: a language model worker's start (load,
compile, warm-up: handlers/text_generation.py) in a process of its own, on the archive's staged
files and `handler:` SETTINGS (JSON); then the Inductor cache it filled (TORCHINDUCTOR_CACHE_DIR,
one of the build's own) and the whole graphs it compiled shipped into STAGING
(handlers/generation/compiled.py).

Exit REFUSED (3): the accuracy guard refused the model at its precision, its reason on stderr.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

REFUSED = 3


def main(argv: list[str]) -> int:
    staging, name, settings = Path(argv[0]), argv[1], json.loads(argv[2])
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    from handlers.accuracy import AccuracyError
    from handlers.generation import compiled
    from handlers.outside_context import worker_context
    from handlers.text_generation import TextGenerationHandler

    handler = TextGenerationHandler()
    try:
        handler.initialize(worker_context(staging, name, settings))
    except AccuracyError as error:
        print(error, file=sys.stderr)
        return REFUSED
    shipped, whole = compiled.ship(compiled.cache_dir(), staging, handler.engine.model.forward)
    size = sum(path.stat().st_size for path in shipped.parent.rglob("*") if path.is_file())
    print(f"shipped {shipped.name} ({size / 1e6:.1f} MB; whole graphs: {', '.join(whole) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
