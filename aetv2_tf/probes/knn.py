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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

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
        flat features ``(B, D)``; it is wrapped in a ``tf.function`` (traced once per batch shape).
      dataset: iterable of ``(images, labels)`` batches, e.g. a ``tf.data.Dataset``.
      pool: average-pool rank-4 feature maps over ``h, w`` to ``(B, C)``; if False they are
        flattened to ``(B, h*w*C)``.

    Returns:
      ``features`` float32 ``(N, D)`` and ``labels`` ``(N,)`` (dtype of the dataset's labels),
      in dataset order.
    """

    @tf.function(reduce_retracing=True)
    def _features(images):
        maps = tf.convert_to_tensor(feature_fn(images))
        if maps.shape.rank == 4 and pool:
            maps = tf.reduce_mean(maps, axis=(1, 2))
        elif maps.shape.rank != 2:
            maps = tf.reshape(maps, (tf.shape(maps)[0], -1))
        return tf.cast(maps, tf.float32)

    feats, labels = [], []
    for images, batch_labels in dataset:
        feats.append(_features(images).numpy())
        labels.append(np.asarray(batch_labels))
    if not feats:
        raise ValueError("extract_features: the dataset is empty")
    return np.concatenate(feats, axis=0), np.concatenate(labels, axis=0)


def _l2_normalise(x: tf.Tensor) -> tf.Tensor:
    """Rows divided by their L2 norm, ``(N, D) -> (N, D)``; zero rows stay zero.

    ``sqrt`` and division are correctly rounded in IEEE float32, so vectors that are exact
    multiples of each other by a power of two normalise to bitwise-identical rows.
    """
    norms = tf.sqrt(tf.reduce_sum(tf.square(x), axis=1, keepdims=True))
    return x / tf.maximum(norms, tf.constant(1e-30, x.dtype))


@tf.function(reduce_retracing=True)
def _knn_chunk(train, train_sq, train_labels, queries, k, num_classes, euclidean):
    """Predictions for one chunk of queries.

    Args:
      train: ``(N, D)`` float32 (already L2-normalised for cosine).
      train_sq: ``(N,)`` float32 squared norms of ``train`` (used by euclidean only).
      train_labels: ``(N,)`` int32.
      queries: ``(Q, D)`` float32 (already L2-normalised for cosine).
      k, num_classes: python ints (static); euclidean: python bool (static).

    Returns:
      ``(Q,)`` int32 predicted classes.
    """
    sim = tf.matmul(queries, train, transpose_b=True)  # (Q, N)
    if euclidean:
        # -||a - b||^2 = 2 a.b - |a|^2 - |b|^2
        q_sq = tf.reduce_sum(tf.square(queries), axis=1, keepdims=True)  # (Q, 1)
        sim = 2.0 * sim - q_sq - train_sq[tf.newaxis, :]
    _, idx = tf.math.top_k(sim, k=k, sorted=True)  # (Q, k); equal values: lower index first
    neighbour_labels = tf.gather(train_labels, idx)  # (Q, k)
    one_hot = tf.one_hot(neighbour_labels, num_classes, dtype=tf.int32)  # (Q, k, C)
    votes = tf.reduce_sum(one_hot, axis=1)  # (Q, C)
    rank_bonus = tf.range(k, 0, -1, dtype=tf.int32)  # k - rank, rank = 0..k-1
    # (k - first_rank) for classes present among the neighbours, 0 for absent classes.
    first_bonus = tf.reduce_max(one_hot * rank_bonus[tf.newaxis, :, tf.newaxis], axis=1)
    score = votes * (k + 1) + first_bonus  # (Q, C), unique maximum
    return tf.argmax(score, axis=1, output_type=tf.int32)


def knn_classify(
    train_features,
    train_labels,
    query_features,
    k: int = 10,
    metric: str = "cosine",
    num_classes: int | None = None,
    query_batch_size: int = 1024,
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
      query_batch_size: queries per matrix product; memory is ``4 * query_batch_size * N`` bytes.

    Returns:
      ``(Q,)`` int64 numpy array of predicted classes.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    train = tf.convert_to_tensor(np.asarray(train_features, dtype=np.float32))
    queries = tf.convert_to_tensor(np.asarray(query_features, dtype=np.float32))
    labels_np = np.asarray(train_labels).astype(np.int64).reshape(-1)
    if train.shape.rank != 2 or queries.shape.rank != 2 or train.shape[1] != queries.shape[1]:
        raise ValueError(f"need (N, D) and (Q, D) features, got {train.shape}, {queries.shape}")
    if labels_np.shape[0] != train.shape[0]:
        raise ValueError(f"{labels_np.shape[0]} labels for {train.shape[0]} training features")
    if not 1 <= k <= train.shape[0]:
        raise ValueError(f"k={k} must be in [1, {train.shape[0]}]")
    if labels_np.size and labels_np.min() < 0:
        raise ValueError("labels must be non-negative")
    if num_classes is None:
        num_classes = int(labels_np.max()) + 1
    elif labels_np.max() >= num_classes:
        raise ValueError(f"label {labels_np.max()} >= num_classes={num_classes}")
    labels = tf.constant(labels_np.astype(np.int32))

    euclidean = metric == "euclidean"
    if not euclidean:
        train, queries = _l2_normalise(train), _l2_normalise(queries)
    train_sq = tf.reduce_sum(tf.square(train), axis=1)

    predictions = []
    for start in range(0, int(queries.shape[0]), query_batch_size):
        chunk = queries[start : start + query_batch_size]
        predictions.append(
            _knn_chunk(train, train_sq, labels, chunk, int(k), int(num_classes), euclidean).numpy()
        )
    if not predictions:
        return np.zeros((0,), np.int64)
    return np.concatenate(predictions).astype(np.int64)


def knn_accuracy(
    train_features,
    train_labels,
    query_features,
    query_labels,
    k: int = 10,
    metric: str = "cosine",
    num_classes: int | None = None,
    query_batch_size: int = 1024,
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
