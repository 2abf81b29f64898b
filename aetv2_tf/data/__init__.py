"""Data: image sources, AETv1 homographies and tf.data pipelines (see docs/conventions.md).

The public names are imported lazily (PEP 562), on first access: the device's modules
(``sampler``, ``warping``, ``layers``: pure ``keras.ops``) must import without TensorFlow, which
``homographies`` and ``pipelines`` need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from aetv2_tf.data.homographies import (
        AETV1_FILL,
        CANONICAL_CORNERS,
        corners,
        normalization_matrix,
        rotation_matrix,
        sample_homographies,
        sample_homography_components,
        square_to_quad,
        to_pixel_homography,
        warp,
    )
    from aetv2_tf.data.pipelines import (
        CIFAR10_MEAN,
        CIFAR10_STD,
        IMAGENET_MEAN,
        IMAGENET_STD,
        classification_dataset,
        decode_resize_crop,
        from_data_service,
        normalization_constants,
        normalize,
        pad_crop_flip,
        pretext_dataset,
        resize_crop,
        resize_shorter_side,
        rotation_dataset,
        to_float,
    )
    from aetv2_tf.data.sources import (
        DataError,
        is_cifar10_dir,
        list_image_folder,
        load_cifar10,
        load_image_folder,
        load_source,
        load_tfds,
    )

_LAZY = {
    "AETV1_FILL": "constants",
    "CANONICAL_CORNERS": "homographies",
    "corners": "homographies",
    "normalization_matrix": "homographies",
    "rotation_matrix": "homographies",
    "sample_homographies": "homographies",
    "sample_homography_components": "homographies",
    "square_to_quad": "homographies",
    "to_pixel_homography": "homographies",
    "warp": "homographies",
    "CIFAR10_MEAN": "constants",
    "CIFAR10_STD": "constants",
    "IMAGENET_MEAN": "constants",
    "IMAGENET_STD": "constants",
    "classification_dataset": "pipelines",
    "decode_resize_crop": "augment",
    "from_data_service": "pipelines",
    "normalization_constants": "constants",
    "normalize": "pipelines",
    "pad_crop_flip": "augment",
    "pretext_dataset": "pipelines",
    "resize_crop": "augment",
    "resize_shorter_side": "augment",
    "rotation_dataset": "pipelines",
    "to_float": "augment",
    "DataError": "sources",
    "is_cifar10_dir": "sources",
    "list_image_folder": "sources",
    "load_cifar10": "sources",
    "load_image_folder": "sources",
    "load_source": "sources",
    "load_tfds": "sources",
}

__all__ = [
    "AETV1_FILL",
    "CANONICAL_CORNERS",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DataError",
    "classification_dataset",
    "corners",
    "decode_resize_crop",
    "from_data_service",
    "is_cifar10_dir",
    "list_image_folder",
    "load_cifar10",
    "load_image_folder",
    "load_source",
    "load_tfds",
    "normalization_matrix",
    "normalization_constants",
    "normalize",
    "pad_crop_flip",
    "pretext_dataset",
    "resize_crop",
    "resize_shorter_side",
    "rotation_dataset",
    "rotation_matrix",
    "sample_homographies",
    "sample_homography_components",
    "square_to_quad",
    "to_float",
    "to_pixel_homography",
    "warp",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
