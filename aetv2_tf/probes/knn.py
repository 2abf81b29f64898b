"""K-nearest-neighbour evaluation of frozen features (the paper's "KNN (k=10)" column).

The paper's "averaged-pooled features from the second convolutional block" of NIN, as the same
lab's published AETv1 code computes them (maple-research-lab/AET, ``cifar/v16_projective_uniform/``
``extract_feat_pooling.py`` and ``knn*.py``; read there, not copied), the DEFAULT (``AUTHORS``):

* Features: block 2 in inference mode, ``(B, 8, 8, 192)``, average-pooled 2x2 with stride 2
  (PyTorch ``avg_pool2d(kernel_size=2)``: no padding, odd sides floored) and flattened
  channel-major like ``(B, 192, 4, 4)``: **3,072 values** (``pool="avg2x2"``); images
  normalised with the dataset's constants, not augmented.
* Metric: **Euclidean** (scikit-learn's default), in float64 as scikit-learn computes it.
* Vote: uniform over the ``k = 10`` nearest; among tied classes the SMALLEST label
  (``ties="smallest_label"``). Sets: 50,000 training images against 10,000 test images.

``GAP_COSINE``, this project's earlier protocol, is an option (global average pooling,
``pool="global"``; cosine; ``ties="nearest"``); its numbers are not comparable with the paper's.

Tie rules (deterministic; `knn_classify`): neighbours of EQUAL similarity rank by training index
(as ``tf.math.top_k``); classes with EQUAL votes: ``"smallest_label"``, or ``"nearest"``, the
class whose best-ranked neighbour comes first (the integer score ``votes * (k + 1) + (k -
first_rank)``: a unique maximum). Similarities are batched matrix products, one chunk of queries
at a time (50k x 10k x 3,072 in float64: about a minute on two cores). The rule is NumPy, on
every backend; features come through ``predict`` (`pooled_features`) or over batches of any
iterable (`extract_features`, traced by ``tf.function`` under TensorFlow).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import keras
import numpy as np

from aetv2_tf.errors import UsageError
from aetv2_tf.input_checks import check_feature, check_images, check_labels

# The pooling of a feature map lives with the features (models); the probes re-export it.
from aetv2_tf.models.features import POOLS, pool_feature_map  # noqa: F401 (public here too)

METRICS = ("cosine", "euclidean")
TIES = ("smallest_label", "nearest")
# The published AETv1 code's KNN (module docstring) and the project's earlier one.
AUTHORS = dict(pool="avg2x2", metric="euclidean", ties="smallest_label", k=10)
GAP_COSINE = dict(pool="global", metric="cosine", ties="nearest", k=10)


def _input_hw(encoder) -> tuple | None:
    """``(H, W)`` of a functional encoder's input (None entries: any size), else None."""
    try:
        return tuple(encoder.inputs[0].shape[1:3])
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


def _functional(encoder: Callable) -> bool:
    """Whether ``encoder`` is a Keras model with a symbolic graph (functional or Sequential)."""
    try:
        return isinstance(encoder, keras.Model) and bool(encoder.inputs)
    except (AttributeError, ValueError):
        return False


def make_feature_fn(encoder: Callable, feature: str | int | None = None) -> Callable:
    """A feature function ``images (B, H, W, 3) -> feature map`` of ``encoder`` in inference
    mode. A functional or Sequential encoder follows `models.features`: a dict key, an output's
    layer name or index, any layer's name (cut there); ``None``: the PROBE feature
    (`models.features.classifier_feature`: NIN "block2", AlexNet "conv5", else the only output);
    an unknown one is a ValueError listing the outputs. Another callable (a SavedModel's
    signature) is called with ``training=False`` and ``feature`` picked from its dict output
    (checked at the first call)."""
    if _functional(encoder):  # any Keras backbone: the one rule of `models.features`
        from aetv2_tf.models.features import (
            classifier_feature,
            cut_encoder,
            is_output,
            select_output,
        )

        feature = classifier_feature(encoder, feature)
        if is_output(encoder, feature):
            return lambda images: select_output(encoder, encoder(images, training=False), feature)
        cut = cut_encoder(encoder, feature)
        return lambda images: cut(images, training=False)

    def feature_fn(images):
        outputs = encoder(images, training=False)
        if isinstance(outputs, dict):
            if feature is None:
                raise ValueError(f"encoder returns a dict {sorted(outputs)}; pass feature=")
            return outputs[check_feature(feature, outputs)]
        return outputs

    return feature_fn


def extract_features(
    feature_fn: Callable, dataset: Iterable, pool: bool | str = "avg2x2"
) -> tuple[np.ndarray, np.ndarray]:
    """``(features float32 (N, D), labels (N,))`` of ``feature_fn`` (``(B, H, W, 3)`` -> a map
    ``(B, h, w, C)`` or ``(B, D)``; a ``tf.function`` under TensorFlow) over ``dataset``, an
    iterable of ``(images (B, H, W, 3) NHWC of any dtype feature_fn takes, labels (B,) class
    indices)`` batches (NCHW and one-hot refused, `input_checks`), in its order. ``pool``
    (`pool_feature_map`): ``"avg2x2"`` (the authors'), ``"global"`` (``True``), ``"flatten"``
    (``False``)."""
    ops = keras.ops
    pool = {True: "global", False: "flatten"}.get(pool, pool)
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS} (or a bool), got {pool!r}")

    def features(images):
        return pool_feature_map(feature_fn(images), pool)

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        features = tf.function(features, reduce_retracing=True)
    feats, labels = [], []
    for images, batch_labels in dataset:
        if not feats:  # the layout, once: any dtype (the feature function's preprocessing)
            check_images(images, name="extract_features: the dataset's images", uint8=False)
        check_labels(batch_labels, name="extract_features: the dataset's labels")
        feats.append(ops.convert_to_numpy(features(images)))
        labels.append(np.asarray(batch_labels))
    if not feats:
        raise ValueError("extract_features: the dataset is empty")
    return np.concatenate(feats, axis=0), np.concatenate(labels, axis=0)


def pooled_features(encoder: keras.Model, feature: str | int | None, images: np.ndarray,
                    mean: Sequence[float], std: Sequence[float],
                    batch_size: int = 256, pool: str = "avg2x2") -> np.ndarray:
    """`(N, H, W, 3)` uint8 -> `(N, D)` float32: the `feature` map of `encoder` (inference
    mode) on the normalised images `(u / 255 - mean) / std`, pooled by `pool_feature_map`:
    ``"avg2x2"`` (default, the authors' KNN: NIN block 2 -> 3,072 values), ``"global"``
    (``(N, C)``) or ``"flatten"``.

    The images must be uint8 NHWC with 3 channels, of the encoder's height and width when it
    has fixed ones (`input_checks.check_images`): floats are REFUSED, with their range and the
    conversion (``(x * 255).round().astype("uint8")`` for [0, 1]), not cast; `feature` as
    `make_feature_fn` (any Keras backbone; an unknown one: the error lists the outputs;
    ``None``: the probe feature of `feature_extractor`, "block2" for NIN)."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    images = np.asarray(check_images(images, name="pooled_features: images",
                                     expected_hw=_input_hw(encoder)))
    feature_fn = make_feature_fn(encoder, feature)
    inputs = keras.Input(tuple(images.shape[1:]), dtype="uint8", name="images")
    x = (keras.ops.cast(inputs, "float32") / 255.0 - np.asarray(mean, np.float32)) \
        / np.asarray(std, np.float32)
    maps = feature_fn(x)
    model = keras.Model(inputs, pool_feature_map(maps, pool))
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


def knn_classify(train_features, train_labels, query_features, k: int = 10,
                 metric: str = "euclidean", num_classes: int | None = None,
                 query_batch_size: int = 256, ties: str = "smallest_label") -> np.ndarray:
    """``(Q,)`` int64 classes of ``query_features (Q, D)`` by the majority vote of their ``k``
    (``1 <= k <= N``) nearest ``train_features (N, D)``, with the tie rules of the module
    docstring. ``train_labels``: ``(N,)`` integers in ``[0, num_classes)`` (default ``max +
    1``; ``(N, 1)`` taken, one-hot refused with the fix, `input_checks.check_labels`).
    ``metric``: ``"euclidean"`` (the authors'; similarity ``-||a - b||^2`` in float64) or
    ``"cosine"`` (L2-normalised, float32). ``query_batch_size``: queries per matrix product
    (memory about ``16 * query_batch_size * N`` bytes). ``ties``: ``"smallest_label"``
    (scikit-learn's) or ``"nearest"``."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if ties not in TIES:
        raise ValueError(f"ties must be one of {TIES}, got {ties!r}")
    train, queries = _checked_features(train_features, query_features, metric == "euclidean")
    labels, num_classes = _checked_labels(train_labels, len(train), k, num_classes)
    predictions = [_vote(chunk, train, labels, k, num_classes, metric == "euclidean", ties)
                   for chunk in np.split(queries, range(query_batch_size, len(queries),
                                                        query_batch_size))]
    return np.concatenate(predictions).astype(np.int64) if len(queries) else np.zeros(0, np.int64)


def _checked_features(train_features, query_features,
                      euclidean: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(N, D)``, ``(Q, D)`` features of `knn_classify`: float64 for Euclidean distances
    (scikit-learn upcasts float32 likewise), else float32 L2-normalised; rows with NaN or inf
    refused (UsageError)."""
    dtype = np.float64 if euclidean else np.float32
    train = np.asarray(np.asarray(train_features, np.float32), dtype)
    queries = np.asarray(np.asarray(query_features, np.float32), dtype)
    if train.ndim != 2 or queries.ndim != 2 or train.shape[1] != queries.shape[1]:
        raise ValueError(f"need (N, D) and (Q, D) features, got {train.shape}, {queries.shape}")
    for name, features in (("train_features", train), ("query_features", queries)):
        bad = int(np.count_nonzero(~np.isfinite(features).all(axis=1)))
        if bad:
            raise UsageError(f"{name}: {bad} of {len(features)} rows hold NaN or infinite "
                             "values, which have no neighbours (the accuracy would be a number "
                             "without meaning); the encoder diverged or was given bad images: "
                             "check them, or drop those rows")
    if euclidean:
        return train, queries
    return _l2_normalise(train), _l2_normalise(queries)


def _checked_labels(train_labels, n: int, k: int,
                    num_classes: int | None) -> tuple[np.ndarray, int]:
    """`knn_classify`'s ``(N,)`` labels, checked with ``k`` against ``n`` training features,
    and the number of classes (``max + 1`` when None)."""
    labels = check_labels(train_labels, n, name="train_labels", what="training features")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}]")
    if labels.size and labels.min() < 0:
        raise ValueError("labels must be non-negative")
    if num_classes is None:
        return labels, int(labels.max()) + 1
    if labels.max() >= num_classes:
        raise ValueError(f"label {labels.max()} >= num_classes={num_classes}")
    return labels, num_classes


def _vote(chunk: np.ndarray, train: np.ndarray, labels: np.ndarray, k: int, num_classes: int,
          euclidean: bool, ties: str) -> np.ndarray:
    """The ``(Q,)`` classes of one chunk of queries ``(Q, D)`` by the vote of their ``k``
    nearest ``train`` features (the tie rules of the module docstring)."""
    sim = chunk @ train.T  # (Q, N)
    if euclidean:  # -||a - b||^2 = 2 a.b - |a|^2 - |b|^2
        sim = 2.0 * sim - np.sum(np.square(chunk), axis=1, keepdims=True) \
            - np.sum(np.square(train), axis=1)[None]
    one_hot = np.eye(num_classes, dtype=np.int64)[labels[_top_k(sim, k)]]  # (Q, k, C)
    votes = one_hot.sum(axis=1)
    if ties == "nearest":  # votes * (k + 1) + (k - first_rank): a unique maximum
        rank_bonus = np.arange(k, 0, -1, dtype=np.int64)  # k - rank
        votes = votes * (k + 1) + (one_hot * rank_bonus[None, :, None]).max(axis=1)
    return np.argmax(votes, axis=1)  # the first maximum: the smallest label


def knn_accuracy(train_features, train_labels, query_features, query_labels, k: int = 10,
                 metric: str = "euclidean", num_classes: int | None = None,
                 query_batch_size: int = 256, ties: str = "smallest_label") -> float:
    """Top-1 accuracy in PERCENT of `knn_classify` on labelled queries ``(Q, D)``, ``(Q,)``
    (labels as `knn_classify`'s: class indices, one-hot refused)."""
    query_labels = check_labels(query_labels, len(query_features), name="query_labels",
                                what="query features")
    predictions = knn_classify(
        train_features, train_labels, query_features, k=k, metric=metric,
        num_classes=num_classes, query_batch_size=query_batch_size, ties=ties,
    )
    return float(100.0 * np.mean(predictions == query_labels))
