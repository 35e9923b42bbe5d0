"""Class names for outputs: from an optional JSON file in the archive, else the class index.

names = Labels.load(model_dir, "index_to_name.json"); names.name(3)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Labels:
    names: tuple[str, ...] = ()
    prefix: str = ""  # used for indices without a name, e.g. "LABEL_" -> "LABEL_1"

    @classmethod
    def load(cls, model_dir: str | Path, labels_file: str, prefix: str = "") -> Labels:
        if not labels_file:
            return cls(prefix=prefix)
        path = Path(model_dir) / labels_file
        if not path.is_file():
            raise FileNotFoundError(f"labels_file {labels_file!r} is not in the archive; add it with --extra-files")
        raw = json.loads(path.read_text())
        # TorchServe's {"0": "tench", ...} mapping or a plain list.
        names = [raw[str(i)] for i in range(len(raw))] if isinstance(raw, dict) else list(raw)
        return cls(tuple(names), prefix)

    def name(self, index: int) -> str:
        return self.names[index] if index < len(self.names) else f"{self.prefix}{index}"
