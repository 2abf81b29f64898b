"""The quick KNN that ends a pretraining run: how good is the encoder, next to a random init.

The full KNN probe (50,000 vs 10,000 images) takes minutes on a CPU; this one scores the FIRST
``train_examples`` training images against the first ``test_examples`` test images with the same
rule (`probes.knn.AUTHORS`), for the trained encoder and a random-init one of the same
architecture and seed: their difference is what the pretraining bought (not comparable to the
paper's full-test-set numbers). Any Keras backend.
"""

from __future__ import annotations

import time

import keras
import numpy as np


def quick_knn(encoder: keras.Model, random_encoder: keras.Model,
              train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
              feature: str, mean, std, k: int = 10, batch_size: int = 256) -> dict[str, float]:
    """KNN top-1 (%) of `encoder` and `random_encoder` on `(images uint8 (N, S, S, 3), labels)`:
    ``{"knn_top1", "random_knn_top1", "knn_gain", "knn_seconds"}``."""
    from aetv2_tf.probes.knn import AUTHORS, knn_accuracy, pooled_features

    start = time.perf_counter()

    def features(model, images, labels):
        return pooled_features(model, feature, images, mean, std, batch_size,
                               pool=AUTHORS["pool"]), labels

    scores = []
    for model in (encoder, random_encoder):
        gallery, queries = features(model, *train), features(model, *test)
        scores.append(knn_accuracy(*gallery, *queries, k=k, metric=AUTHORS["metric"],
                                   ties=AUTHORS["ties"],
                                   num_classes=int(max(train[1].max(), test[1].max())) + 1))
    return dict(knn_top1=scores[0], random_knn_top1=scores[1], knn_gain=scores[0] - scores[1],
                knn_seconds=round(time.perf_counter() - start, 1))
