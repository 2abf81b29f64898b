"""The KNN probe in NumPy, for Keras backends other than TensorFlow (no TensorFlow import).

The same rule as `aetv2_tf.probes.knn` (whose docstring fixes it): average-pooled features,
cosine similarity of L2-normalised float32 rows (or `-||a - b||^2`), the `k` most similar training
examples with EQUAL similarities ranked by training index (lower first), a majority vote, and
vote ties won by the class whose best-ranked neighbour comes first (the integer score
`votes * (k + 1) + (k - first_rank)`). `tests/test_jax_cli.py` checks that it predicts what the
TensorFlow version predicts, ties included.

Features come from a Keras model through `predict` (jitted batches on the device), pooled on the
device: `(N, H, W, 3)` uint8 images -> `(N, C)` float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

METRICS = ("cosine", "euclidean")  # as aetv2_tf.probes.knn (which imports TensorFlow)


def pooled_features(encoder: keras.Model, feature: str, images: np.ndarray,
                    mean: Sequence[float], std: Sequence[float],
                    batch_size: int = 256) -> np.ndarray:
    """`(N, H, W, 3)` uint8 -> `(N, C)` float32: the average-pooled `feature` map of `encoder`
    (inference mode) on the normalised images `(u / 255 - mean) / std`."""
    inputs = keras.Input(tuple(images.shape[1:]), dtype="uint8", name="images")
    x = (keras.ops.cast(inputs, "float32") / 255.0 - np.asarray(mean, np.float32)) \
        / np.asarray(std, np.float32)
    maps = encoder(x, training=False)
    maps = maps[feature] if isinstance(maps, dict) else maps
    pooled = keras.layers.GlobalAveragePooling2D(dtype="float32")(maps) if len(maps.shape) == 4 \
        else keras.layers.Flatten(dtype="float32")(maps)
    model = keras.Model(inputs, pooled)
    return np.asarray(model.predict(images, batch_size=batch_size, verbose=0), np.float32)


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.sum(np.square(x), axis=1, keepdims=True, dtype=np.float32))
    return x / np.maximum(norms, np.float32(1e-30))


def _top_k(sim: np.ndarray, k: int) -> np.ndarray:
    """(Q, N) -> (Q, k) indices of the largest values, equal values by lower index first."""
    neg = -sim
    part = np.argpartition(neg, k - 1, axis=1)[:, :k]
    kth = np.take_along_axis(neg, part, axis=1).max(axis=1)
    out = np.empty((sim.shape[0], k), np.int64)
    for row in range(sim.shape[0]):
        candidates = np.flatnonzero(neg[row] <= kth[row])  # every tie at the k-th value
        order = np.lexsort((candidates, neg[row, candidates]))[:k]
        out[row] = candidates[order]
    return out


def knn_classify(train_features, train_labels, query_features, k: int = 10,
                 metric: str = "cosine", num_classes: int | None = None,
                 query_batch_size: int = 1024) -> np.ndarray:
    """`aetv2_tf.probes.knn.knn_classify` in NumPy: `(N, D)`, `(N,)`, `(Q, D)` -> `(Q,)` int64."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    train = np.asarray(train_features, np.float32)
    queries = np.asarray(query_features, np.float32)
    labels = np.asarray(train_labels).astype(np.int64).reshape(-1)
    if train.ndim != 2 or queries.ndim != 2 or train.shape[1] != queries.shape[1]:
        raise ValueError(f"need (N, D) and (Q, D) features, got {train.shape}, {queries.shape}")
    if labels.shape[0] != train.shape[0] or not 1 <= k <= train.shape[0]:
        raise ValueError(f"{labels.shape[0]} labels for {train.shape[0]} features, k={k}")
    num_classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    euclidean = metric == "euclidean"
    if not euclidean:
        train, queries = _l2_normalise(train), _l2_normalise(queries)
    train_sq = np.sum(np.square(train), axis=1, dtype=np.float32)
    rank_bonus = np.arange(k, 0, -1, dtype=np.int64)  # k - rank
    predictions = []
    for start in range(0, queries.shape[0], query_batch_size):
        chunk = queries[start:start + query_batch_size]
        sim = chunk @ train.T
        if euclidean:
            sim = 2.0 * sim - np.sum(np.square(chunk), axis=1, keepdims=True) - train_sq[None]
        one_hot = np.eye(num_classes, dtype=np.int64)[labels[_top_k(sim, k)]]  # (Q, k, C)
        score = one_hot.sum(axis=1) * (k + 1) + (one_hot * rank_bonus[None, :, None]).max(axis=1)
        predictions.append(np.argmax(score, axis=1))
    return np.concatenate(predictions).astype(np.int64) if predictions else np.zeros(0, np.int64)


def knn_accuracy(train_features, train_labels, query_features, query_labels, k: int = 10,
                 metric: str = "cosine", num_classes: int | None = None) -> float:
    """Top-1 accuracy in PERCENT of `knn_classify` on labelled queries."""
    predictions = knn_classify(train_features, train_labels, query_features, k, metric,
                               num_classes)
    return float(100.0 * np.mean(predictions == np.asarray(query_labels).reshape(-1)))
