"""TorchServe's own Context, built outside a worker: a handler started by the kit itself (the
build's compile step, model_store/lm_compile.py) or by a unit test gets what a worker of the model
gets from TorchServe.

    handler.initialize(worker_context(model_dir, "lm", {"backend": "inductor"}))
"""

from __future__ import annotations

from pathlib import Path

import ts
from ts.context import Context
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

METRICS_CONFIG = Path(ts.__file__).parent / "configs" / "metrics.yaml"


def worker_context(model_dir: Path, name: str, settings: dict, batch_size: int = 1) -> Context:
    """The Context of a worker of model `name` in `model_dir`, its model file's `handler:` settings."""
    metrics = MetricsCacheYamlImpl(str(METRICS_CONFIG))
    metrics.initialize_cache()
    manifest = {"model": {"modelName": name}}
    return Context(
        name,
        str(model_dir),
        manifest,
        batch_size,
        None,
        ts.__version__,
        metrics=metrics,
        model_yaml_config={"handler": settings},
    )
