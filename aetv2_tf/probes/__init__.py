"""Evaluation of frozen encoders: `knn` (`knn_classify`, `knn_accuracy`, `extract_features`,
`pooled_features`), `quick_knn`, `classifier` (`build_probe_model`, `train_probe`,
`split_train_val`, `probe_optimizer`, `step_lr_schedule`), `results` (``results.json``), and what
the program's probe stage reads (`frozen_encoder`, `splits`; `aetv2_tf.program.probe_stage`,
never imported here). Names are imported lazily: ``aetv2_tf.probes.results`` (and the report
CLI) does not pull in TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "extract_features": "knn",
    "knn_accuracy": "knn",
    "knn_classify": "knn",
    "make_feature_fn": "knn",
    "pooled_features": "knn",
    "quick_knn": "quick_knn",
    "build_probe": "classifier",
    "build_probe_model": "classifier",
    "probe_optimizer": "classifier",
    "split_train_val": "classifier",
    "step_lr_schedule": "classifier",
    "train_probe": "classifier",
    "read_results": "results",
    "write_results": "results",
    "ResultsError": "results",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
