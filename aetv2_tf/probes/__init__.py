"""Evaluation of frozen encoders: KNN, classifier heads, and their ``results.json``.

* `knn`: `extract_features`, `knn_classify`, `knn_accuracy` (cosine, k=10, deterministic ties),
  `pooled_features` (uint8 images -> pooled features); `quick_knn`: `quick_knn` (an encoder beside a
  random init).
* `classifier`: `build_probe_model`, `train_probe` (epoch selected on a validation split of the
  training set, test evaluated once), `split_train_val`, `probe_optimizer`, `step_lr_schedule`.
* `results`: `write_results` / `read_results` of ``results.json`` (read by `aetv2_tf.report`).
* `frozen_encoder` (the frozen encoder named by ``--pretrained``) and `splits` (train/val/test
  splits): what ``--stage=probe`` / ``--stage=supervised`` of ``python -m aetv2_tf.train`` reads
  (`aetv2_tf.program.probe_stage`, the program layer, which this package never imports).

Names are imported lazily so that ``aetv2_tf.probes.results`` (and the report CLI) does not pull in
TensorFlow.
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
