"""KNN probe: exact agreement with an independent float64 brute force, tie rules included, and
with scikit-learn's KNeighborsClassifier (the published AETv1 code's classifier)."""

import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.probes.knn import extract_features, knn_accuracy, knn_classify, make_feature_fn


def brute_force_knn(train, labels, queries, k, metric, num_classes, ties="nearest"):
    """Reference: one query at a time in float64, written from the tie rules, not from the code.

    Neighbours: sort by similarity (descending), equal similarities by training index (ascending).
    Vote: most frequent class; among classes with equal counts, the one met first in that order
    (ties="nearest") or the smallest (ties="smallest_label").
    """
    train = np.asarray(train, np.float64)
    queries = np.asarray(queries, np.float64)
    if metric == "cosine":
        def unit(x):
            norms = np.sqrt((x * x).sum(axis=1, keepdims=True))
            return x / np.where(norms > 0, norms, 1.0)
        train, queries = unit(train), unit(queries)
    out = []
    for q in queries:
        if metric == "cosine":
            sims = (train * q).sum(axis=1)
        else:
            sims = -((train - q) ** 2).sum(axis=1)
        order = np.lexsort((np.arange(len(train)), -sims))[:k]
        neighbour_labels = labels[order]
        votes = np.bincount(neighbour_labels, minlength=num_classes)
        tied = set(np.flatnonzero(votes == votes.max()))
        out.append(min(tied) if ties == "smallest_label"
                   else next(c for c in neighbour_labels if c in tied))
    return np.array(out)


def top_gap(train, queries, k, metric):
    """Smallest float64 gap between consecutive similarities among each query's k+1 best."""
    train = np.asarray(train, np.float64)
    queries = np.asarray(queries, np.float64)
    if metric == "cosine":
        train = train / np.linalg.norm(train, axis=1, keepdims=True)
        queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        sims = queries @ train.T
    else:
        sims = -((queries[:, None, :] - train[None, :, :]) ** 2).sum(-1)
    best = -np.sort(-sims, axis=1)[:, : k + 1]
    return float(np.min(best[:, :-1] - best[:, 1:]))


@pytest.mark.parametrize("ties", ["smallest_label", "nearest"])
@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_random_continuous_features_match_brute_force(metric, ties):
    rng = np.random.default_rng(7)
    train = rng.standard_normal((400, 24)).astype(np.float32)
    labels = rng.integers(0, 10, size=400)
    queries = rng.standard_normal((150, 24)).astype(np.float32)
    # Precondition: no near-ties that float32 rounding could reorder (general position).
    assert top_gap(train, queries, 10, metric) > 1e-5
    got = knn_classify(train, labels, queries, k=10, metric=metric, query_batch_size=64,
                       ties=ties)
    want = brute_force_knn(train, labels, queries, 10, metric, 10, ties)
    np.testing.assert_array_equal(got, want)


def _tied_dataset(rng, metric, n=600, q=300):
    """Features whose float32 similarities are exact, so ties are real ties in both codes.

    euclidean: small integers (every product and sum is an exact float32 integer);
    cosine: +-1 vectors of dimension 16 (unit vectors with entries +-1/4, exact dots), plus copies
    scaled by 2 and 4 (parallel: the same cosine), and one zero vector (cosine 0 with everything).
    Duplicated training vectors get different labels.
    """
    if metric == "euclidean":
        train = rng.integers(-2, 3, size=(n, 6)).astype(np.float32)
        queries = rng.integers(-2, 3, size=(q, 6)).astype(np.float32)
    else:
        train = rng.choice([-1.0, 1.0], size=(n, 16)).astype(np.float32)
        queries = rng.choice([-1.0, 1.0], size=(q, 16)).astype(np.float32)
        train[n // 2 : n // 2 + 50] = 2.0 * train[:50]
        train[n // 2 + 50 : n // 2 + 100] = 4.0 * train[50:100]
        train[-1] = 0.0
    # Exact duplicates (different labels below), and queries equal to training vectors.
    train[100:150] = train[0:50]
    queries[:40] = train[0:40]
    labels = rng.integers(0, 7, size=n)
    return train, labels, queries


@pytest.mark.parametrize("ties", ["smallest_label", "nearest"])
@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_ties_match_brute_force(metric, k, ties):
    rng = np.random.default_rng(3 + k)
    train, labels, queries = _tied_dataset(rng, metric)
    got = knn_classify(train, labels, queries, k=k, metric=metric, num_classes=7,
                       query_batch_size=128, ties=ties)
    want = brute_force_knn(train, labels, queries, k, metric, 7, ties)
    np.testing.assert_array_equal(got, want)


def test_ties_are_frequent_in_the_tied_dataset():
    """Guard that the tie test really exercises both tie rules (same data as k = 4 above)."""
    rng = np.random.default_rng(3 + 4)
    train, labels, queries = _tied_dataset(rng, "cosine")
    sims = (queries / 4.0) @ (train / np.maximum(np.linalg.norm(train, axis=1), 1e-30)[:, None]).T
    top = -np.sort(-sims, axis=1)[:, :11]
    assert np.mean(top[:, 9] == top[:, 10]) > 0.5  # neighbour ties at the k boundary
    votes_tied = 0
    for i in range(len(queries)):
        order = np.lexsort((np.arange(len(train)), -sims[i]))[:4]
        v = np.bincount(labels[order], minlength=7)
        votes_tied += int((v == v.max()).sum() > 1)
    assert votes_tied > 50  # class-vote ties with k = 4


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_crafted_ties(metric):
    v = np.array([1.0, 2.0, 0.5], np.float32)
    far = np.array([[-5.0, 1.0, 3.0], [4.0, -4.0, -4.0], [-3.0, -3.0, 1.0]], np.float32)
    # Rule 1: identical training vectors, labels 2, 0, 1: the lowest training index wins.
    train = np.stack([v, v, v, *far])
    labels = np.array([2, 0, 1, 3, 3, 3])
    query = v[None]
    assert knn_classify(train, labels, query, k=1, metric=metric)[0] == 2
    assert knn_classify(train[[1, 0, 2, 3, 4, 5]], labels[[1, 0, 2, 3, 4, 5]], query, k=1,
                        metric=metric)[0] == 0
    # Rule 2: one vote each for 2, 0, 1 (k = 3): "nearest" takes the class of the best-ranked
    # neighbour, 2; "smallest_label" (scikit-learn's, the default) takes 0.
    assert knn_classify(train, labels, query, k=3, metric=metric, ties="nearest")[0] == 2
    assert knn_classify(train, labels, query, k=3, metric=metric)[0] == 0
    # Rule 2 with 2 votes each: ranks 0..3 have classes 3, 1, 1, 3 -> 3 wins the tie.
    line = np.array([[0.0, 0.0], [1.0, 0.1], [2.0, 0.2], [3.0, 0.3], [9.0, 5.0]], np.float32)
    train2 = np.array([[1.0, 0.0], [1.0, 0.1], [1.0, 0.2], [1.0, 0.3], [0.0, 1.0]], np.float32)
    feats = line if metric == "euclidean" else train2
    labels2 = np.array([3, 1, 1, 3, 0])
    q2 = np.array([[0.0, 0.0]]) if metric == "euclidean" else np.array([[1.0, 0.0]])
    assert knn_classify(feats, labels2, q2, k=4, metric=metric, ties="nearest")[0] == 3
    assert knn_classify(feats, labels2, q2, k=4, metric=metric)[0] == 1
    # A strict majority beats an earlier first neighbour: ranks 0..2 are 3, 1, 1 -> 1.
    for ties in ("nearest", "smallest_label"):
        assert knn_classify(feats, labels2, q2, k=3, metric=metric, ties=ties)[0] == 1


def test_chunking_does_not_change_predictions_and_scale_runs():
    rng = np.random.default_rng(0)
    train = rng.standard_normal((20000, 64)).astype(np.float32)
    labels = rng.integers(0, 10, size=20000)
    queries = rng.standard_normal((2000, 64)).astype(np.float32)
    a = knn_classify(train, labels, queries, k=10)
    b = knn_classify(train, labels, queries, k=10, query_batch_size=300)
    assert a.shape == (2000,) and a.dtype == np.int64
    assert a.min() >= 0 and a.max() < 10
    np.testing.assert_array_equal(a, b)
    acc = knn_accuracy(train, labels, queries, a, k=10)
    assert acc == 100.0


def test_knn_accuracy_on_separable_clusters():
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((5, 32)) * 5
    y_train = rng.integers(0, 5, size=500)
    y_test = rng.integers(0, 5, size=100)
    x_train = centres[y_train] + rng.standard_normal((500, 32))
    x_test = centres[y_test] + rng.standard_normal((100, 32))
    for metric in ("cosine", "euclidean"):
        assert knn_accuracy(x_train, y_train, x_test, y_test, k=10, metric=metric) > 95.0


def test_argument_errors():
    x = np.zeros((5, 3), np.float32)
    with pytest.raises(ValueError, match="metric"):
        knn_classify(x, np.zeros(5, int), x, metric="manhattan")
    with pytest.raises(ValueError, match="k="):
        knn_classify(x, np.zeros(5, int), x, k=6)
    with pytest.raises(ValueError, match="num_classes"):
        knn_classify(x, np.array([0, 1, 2, 3, 4]), x, k=1, num_classes=3)
    with pytest.raises(ValueError, match="ties"):
        knn_classify(x, np.zeros(5, int), x, k=1, ties="random")


def test_extract_features_pools_and_keeps_order():
    import keras

    inputs = keras.Input((8, 8, 3))
    maps = keras.layers.Conv2D(5, 3, padding="same")(inputs)
    flat = keras.layers.GlobalAveragePooling2D()(maps)
    encoder = keras.Model(inputs, {"map": maps, "flat": flat})
    rng = np.random.default_rng(0)
    images = rng.standard_normal((10, 8, 8, 3)).astype(np.float32)
    labels = np.arange(10)
    ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(4)
    want_map = encoder(images, training=False)["map"].numpy()

    feats, got_labels = extract_features(make_feature_fn(encoder, "map"), ds, pool="global")
    np.testing.assert_array_equal(got_labels, labels)
    assert feats.shape == (10, 5) and feats.dtype == np.float32
    np.testing.assert_allclose(feats, want_map.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)

    # The authors' 2x2 pooling, channel-major (a PyTorch (B, C, 4, 4) tensor flattened).
    authors, _ = extract_features(make_feature_fn(encoder, "map"), ds)
    want = want_map.reshape(10, 4, 2, 4, 2, 5).mean(axis=(2, 4)).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(authors, want.reshape(10, -1), rtol=1e-5, atol=1e-6)
    assert extract_features(make_feature_fn(encoder, "map"), ds, pool=True)[0].shape == (10, 5)

    flat_feats, _ = extract_features(make_feature_fn(encoder, "flat"), ds)
    np.testing.assert_allclose(flat_feats, feats, rtol=1e-5, atol=1e-6)
    unpooled, _ = extract_features(make_feature_fn(encoder, "map"), ds, pool=False)
    assert unpooled.shape == (10, 8 * 8 * 5)
    with pytest.raises(ValueError, match="feature="):
        make_feature_fn(encoder)(images)


@pytest.mark.slow
def test_matches_scikit_learn_on_real_block2_features(cifar_slice_for_knn):
    """The default protocol against scikit-learn's KNeighborsClassifier (the published AETv1
    code's classifier: k = 10, uniform weights, Euclidean) on the same 3,072-value features of
    real CIFAR-10 images, to the last query; the features are checked against a NumPy float64
    2x2 pooling of the block-2 map."""
    import keras
    from sklearn.neighbors import KNeighborsClassifier

    from aetv2_tf.data.constants import normalization_constants
    from aetv2_tf.models import build_backbone
    from aetv2_tf.probes.knn import pooled_features

    (train_x, train_y), (test_x, test_y) = cifar_slice_for_knn
    keras.utils.set_random_seed(0)
    encoder = build_backbone("nin", (32, 32, 3))
    mean, std = normalization_constants("cifar10")
    gallery = pooled_features(encoder, "block2", train_x, mean, std)
    queries = pooled_features(encoder, "block2", test_x, mean, std)
    assert gallery.shape == (len(train_x), 3072)
    maps = encoder((test_x[:8] / 255.0 - np.float32(mean)) / np.float32(std),
                   training=False)["block2"]
    maps = np.asarray(maps, np.float64).reshape(8, 4, 2, 4, 2, 192).mean(axis=(2, 4))
    np.testing.assert_allclose(queries[:8], maps.transpose(0, 3, 1, 2).reshape(8, -1),
                               rtol=1e-4, atol=1e-4)
    got = knn_classify(gallery, train_y, queries, k=10, num_classes=10)
    want = KNeighborsClassifier(n_neighbors=10).fit(gallery, train_y).predict(queries)
    np.testing.assert_array_equal(got, want)
    assert len(set(got.tolist())) > 3  # a real classification, not one class


@pytest.fixture(scope="module")
def cifar_slice_for_knn(cifar10_dir):
    from aetv2_tf.data.sources import load_cifar10

    train_x, train_y = load_cifar10(cifar10_dir, "train")
    test_x, test_y = load_cifar10(cifar10_dir, "test")
    return (train_x[:1500], train_y[:1500]), (test_x[:500], test_y[:500])


def test_feature_none_is_the_probe_feature_of_feature_extractor():
    """`pooled_features` / `make_feature_fn` with `feature=None` probe what `feature_extractor`
    and `build_classifier` probe by default (NIN block 2, `models.features.classifier_feature`),
    not the pretext models' block 4."""
    import keras

    from aetv2_tf.data.constants import CIFAR10_MEAN, CIFAR10_STD
    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.features import classifier_feature, default_feature
    from aetv2_tf.models.image_models import feature_extractor
    from aetv2_tf.probes.knn import pooled_features

    keras.utils.set_random_seed(0)
    nin = build_backbone("nin", (16, 16, 3))
    assert classifier_feature(nin) == "block2" and default_feature(nin) == "block4"
    images = np.random.default_rng(0).integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
    default = pooled_features(nin, None, images, CIFAR10_MEAN, CIFAR10_STD, batch_size=4)
    block2 = pooled_features(nin, "block2", images, CIFAR10_MEAN, CIFAR10_STD, batch_size=4)
    assert default.shape == (6, 192 * 2 * 2)
    np.testing.assert_array_equal(default, block2)
    np.testing.assert_allclose(feature_extractor(nin).predict(images, verbose=0), default,
                               atol=1e-5)
    x = (images / 255.0 - np.float32(CIFAR10_MEAN)) / np.float32(CIFAR10_STD)
    np.testing.assert_allclose(make_feature_fn(nin)(x.astype("float32")),
                               nin(x.astype("float32"), training=False)["block2"], atol=1e-6)
