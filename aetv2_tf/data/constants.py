"""The data constants of every backend, in one place (no TensorFlow import).

Per-channel normalisation `(u / 255 - mean) / std` of uint8 images, and AETv1's grey fill.
"""

from __future__ import annotations

#: CIFAR-10 normalisation, as the AETv1 code has it (docs/method.md, section 2).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
#: ImageNet normalisation (the 224-pixel protocol: ImageNet, Places, image folders).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: CIFAR-10's classes.
CIFAR10_CLASSES = 10
#: AETv1's grey fill (128, 128, 128) on uint8 images, in ``[0, 1]``.
AETV1_FILL = 128.0 / 255.0


def normalization_constants(dataset: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) per channel of the images a model trained on `dataset` expects."""
    return (CIFAR10_MEAN, CIFAR10_STD) if dataset == "cifar10" else (IMAGENET_MEAN, IMAGENET_STD)
