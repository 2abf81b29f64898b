"""Data: image sources, AETv1 homographies and tf.data pipelines (see docs/conventions.md).

The public names are imported lazily (PEP 562), on first access: the device's modules
(``sampler``, ``warping``, ``preprocessing_layers``: pure ``keras.ops``) must import without
TensorFlow, which ``homographies`` and ``pipelines`` need.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Where each public name is defined, by module.
_MODULES = {
    "constants": ("AETV1_FILL", "CIFAR10_MEAN", "CIFAR10_STD", "IMAGENET_MEAN", "IMAGENET_STD",
                  "normalization_constants"),
    "homographies": ("CANONICAL_CORNERS", "corners", "normalization_matrix", "rotation_matrix",
                     "sample_homographies", "sample_homography_components", "square_to_quad",
                     "to_pixel_homography", "warp"),
    "augment": ("decode_resize_crop", "pad_crop_flip", "resize_crop", "resize_shorter_side",
                "to_float"),
    "pipelines": ("classification_dataset", "from_data_service", "normalize", "pretext_dataset",
                  "rotation_dataset"),
    "sources": ("DataError", "is_cifar10_dir", "list_image_folder", "load_cifar10",
                "load_image_folder", "load_source", "load_tfds"),
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
