"""K-nearest-neighbour evaluation of frozen features (the paper's "KNN (k=10)" column).

The paper reports a KNN error on average-pooled block-2 NIN features of CIFAR-10 (REFERENCE.md,
section 1) but publishes no code. This module fixes every choice explicitly:

* Features: the encoder's feature map ``(B, h, w, C)`` is average-pooled over space to ``(B, C)``
  (``extract_features(pool=True)``); already flat features ``(B, D)`` are used as they are.
* Metric: cosine similarity by default, the usual choice for evaluating self-supervised features
  with a KNN (it ignores the overall scale of a feature vector, which the pretext task does not
  constrain), or negative squared Euclidean distance.
* Vote: plain majority over the ``k`` nearest training examples (unweighted).

Tie rules (deterministic, implemented exactly; `knn_classify`):

1. Neighbours with EQUAL similarity are ranked by training index, the lower index first. This is
   what ``tf.math.top_k`` does: its documentation states "If two elements are equal, the
   lower-index element appears first" (checked on TF 2.21 CPU, also for all-equal rows).
2. Classes with EQUAL vote counts: the class whose best-ranked neighbour comes first wins (the
   class of the nearest neighbour among the tied classes). Implemented as the integer score
   ``votes * (k + 1) + (k - first_rank)``, where ``first_rank`` in ``0..k-1`` is the rank of the
   class's first neighbour; one extra vote (worth ``k + 1``) always beats any rank bonus (at most
   ``k``), and two different classes never share a first rank, so the arg-max is unique.

Similarities are computed in float32 with batched matrix products, one chunk of queries at a time
(``query_batch_size`` x ``num_train`` similarities in memory), so 50k x 10k x 192 takes seconds.

One implementation for every Keras backend: the rule is NumPy; features come from a Keras model
or a feature function, through ``predict`` (`pooled_features`: uint8 images) or over batches of
any iterable (`extract_features`: e.g. a tf.data pipeline, traced by ``tf.function`` under
TensorFlow).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import keras
import numpy as np

METRICS = ("cosine", "euclidean")


def make_feature_fn(encoder: Callable, feature: str | None = None) -> Callable:
    """A feature function ``images (B, H, W, 3) -> feature map`` from a Keras encoder.

    Calls ``encoder(images, training=False)`` (BatchNorm in inference mode) and, when the encoder
    returns a dict (``build_nin`` -> ``{"block1".."block4"}``), picks ``feature`` from it.
    """

    def feature_fn(images):
        outputs = encoder(images, training=False)
        if isinstance(outputs, dict):
            if feature is None:
                raise ValueError(f"encoder returns a dict {sorted(outputs)}; pass feature=")
            return outputs[feature]
        return outputs

    return feature_fn


def extract_features(
    feature_fn: Callable, dataset: Iterable, pool: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``feature_fn`` over a batched dataset and collect features and labels.

    Args:
      feature_fn: maps an image batch ``(B, H, W, 3)`` to a feature map ``(B, h, w, C)`` or to
        flat features ``(B, D)``; under TensorFlow it is wrapped in a ``tf.function`` (traced once
        per batch shape).
      dataset: iterable of ``(images, labels)`` batches, e.g. a ``tf.data.Dataset``.
      pool: average-pool rank-4 feature maps over ``h, w`` to ``(B, C)``; if False they are
        flattened to ``(B, h*w*C)``.

    Returns:
      ``features`` float32 ``(N, D)`` and ``labels`` ``(N,)`` (dtype of the dataset's labels),
      in dataset order.
    """
    ops = keras.ops

    def features(images):
        maps = ops.convert_to_tensor(feature_fn(images))
        if len(maps.shape) == 4 and pool:
            maps = ops.mean(maps, axis=(1, 2))
        elif len(maps.shape) != 2:
            maps = ops.reshape(maps, (ops.shape(maps)[0], -1))
        return ops.cast(maps, "float32")

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        features = tf.function(features, reduce_retracing=True)
    feats, labels = [], []
    for images, batch_labels in dataset:
        feats.append(ops.convert_to_numpy(features(images)))
        labels.append(np.asarray(batch_labels))
    if not feats:
        raise ValueError("extract_features: the dataset is empty")
    return np.concatenate(feats, axis=0), np.concatenate(labels, axis=0)


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
    # Whole batches only (several devices split each evenly): the last one is padded with
    # copies, dropped after; the others are read in place (no copy of the whole set).
    whole = len(images) - len(images) % batch_size
    parts = [model.predict(images[:whole], batch_size=batch_size, verbose=0)] if whole else []
    if whole < len(images):
        last = images[whole:]
        padded = np.concatenate([last, np.repeat(last[-1:], batch_size - len(last), 0)])
        parts.append(model.predict(padded, batch_size=batch_size, verbose=0)[:len(last)])
    return np.asarray(np.concatenate(parts), np.float32)


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.sum(np.square(x), axis=1, keepdims=True, dtype=np.float32))
    return x / np.maximum(norms, np.float32(1e-30))


def _top_k(sim: np.ndarray, k: int) -> np.ndarray:
    """(Q, N) -> (Q, k) indices of the largest values, equal values by lower index first.
    `sim` is overwritten (negated in place; NaN counts as the least similar)."""
    neg = np.negative(sim, out=sim)
    neg[np.isnan(neg)] = np.inf
    part = np.argpartition(neg, k - 1, axis=1)[:, :k]
    kth = np.take_along_axis(neg, part, axis=1).max(axis=1)
    out = np.empty((sim.shape[0], k), np.int64)
    for row in range(sim.shape[0]):
        candidates = np.flatnonzero(neg[row] <= kth[row])  # every tie at the k-th value
        order = np.lexsort((candidates, neg[row, candidates]))[:k]
        out[row] = candidates[order]
    return out


def knn_classify(
    train_features,
    train_labels,
    query_features,
    k: int = 10,
    metric: str = "cosine",
    num_classes: int | None = None,
    query_batch_size: int = 256,
) -> np.ndarray:
    """Majority-vote KNN classification with the deterministic tie rules of the module docstring.

    Args:
      train_features: ``(N, D)`` array-like, the labelled reference set.
      train_labels: ``(N,)`` integer labels in ``[0, num_classes)``.
      query_features: ``(Q, D)`` array-like.
      k: number of neighbours, ``1 <= k <= N``.
      metric: ``"cosine"`` (default; similarity of L2-normalised vectors) or ``"euclidean"``
        (similarity ``-||a - b||^2``).
      num_classes: number of classes; defaults to ``max(train_labels) + 1``.
      query_batch_size: queries per matrix product; memory is about ``12 * query_batch_size * N``
        bytes (the similarities and the partition's indices).

    Returns:
      ``(Q,)`` int64 numpy array of predicted classes.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    train = np.asarray(train_features, np.float32)
    queries = np.asarray(query_features, np.float32)
    labels = np.asarray(train_labels).astype(np.int64).reshape(-1)
    if train.ndim != 2 or queries.ndim != 2 or train.shape[1] != queries.shape[1]:
        raise ValueError(f"need (N, D) and (Q, D) features, got {train.shape}, {queries.shape}")
    if labels.shape[0] != train.shape[0]:
        raise ValueError(f"{labels.shape[0]} labels for {train.shape[0]} training features")
    if not 1 <= k <= train.shape[0]:
        raise ValueError(f"k={k} must be in [1, {train.shape[0]}]")
    if labels.size and labels.min() < 0:
        raise ValueError("labels must be non-negative")
    if num_classes is None:
        num_classes = int(labels.max()) + 1
    elif labels.max() >= num_classes:
        raise ValueError(f"label {labels.max()} >= num_classes={num_classes}")
    euclidean = metric == "euclidean"
    if not euclidean:
        train, queries = _l2_normalise(train), _l2_normalise(queries)
    train_sq = np.sum(np.square(train), axis=1, dtype=np.float32)
    rank_bonus = np.arange(k, 0, -1, dtype=np.int64)  # k - rank
    predictions = []
    for start in range(0, queries.shape[0], query_batch_size):
        chunk = queries[start:start + query_batch_size]
        sim = chunk @ train.T  # (Q, N)
        if euclidean:  # -||a - b||^2 = 2 a.b - |a|^2 - |b|^2
            sim = 2.0 * sim - np.sum(np.square(chunk), axis=1, keepdims=True) - train_sq[None]
        one_hot = np.eye(num_classes, dtype=np.int64)[labels[_top_k(sim, k)]]  # (Q, k, C)
        # votes * (k + 1) + (k - first_rank): a unique maximum (module docstring).
        score = one_hot.sum(axis=1) * (k + 1) + (one_hot * rank_bonus[None, :, None]).max(axis=1)
        predictions.append(np.argmax(score, axis=1))
    return np.concatenate(predictions).astype(np.int64) if predictions else np.zeros(0, np.int64)


def knn_accuracy(
    train_features,
    train_labels,
    query_features,
    query_labels,
    k: int = 10,
    metric: str = "cosine",
    num_classes: int | None = None,
    query_batch_size: int = 256,
) -> float:
    """Top-1 accuracy in PERCENT of `knn_classify` on labelled queries ``(Q, D)``, ``(Q,)``."""
    predictions = knn_classify(
        train_features, train_labels, query_features, k=k, metric=metric,
        num_classes=num_classes, query_batch_size=query_batch_size,
    )
    query_labels = np.asarray(query_labels).astype(np.int64).reshape(-1)
    if query_labels.shape != predictions.shape:
        raise ValueError(f"{query_labels.shape[0]} labels for {predictions.shape[0]} queries")
    return float(100.0 * np.mean(predictions == query_labels))
