"""tf.data pipelines: shapes, determinism, the applied T, augmentation, the ImageNet variant."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.data.homographies import AETV1_FILL, CANONICAL_CORNERS, warp
from aetv2_tf.data.pipelines import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    classification_dataset,
    normalize,
    pretext_dataset,
    resize_shorter_side,
)
from aetv2_tf.data.sources import load_cifar10
from aetv2_tf.method.geometry import params_to_matrix

MEAN, STD = np.array(CIFAR10_MEAN, np.float32), np.array(CIFAR10_STD, np.float32)


@pytest.fixture(scope="module")
def cifar(cifar10_dir):
    x, y = load_cifar10(cifar10_dir, "test")
    return x[:512], y[:512]


def _take(ds, n):
    return [tf.nest.map_structure(lambda t: t.numpy(), b) for b in itertools.islice(ds, n)]


def _raw(normalised):
    return normalised * STD + MEAN


def test_normalize():
    image = np.array([[[0, 128, 255]]], np.uint8)
    expected = (np.array([0, 128, 255]) / 255.0 - MEAN) / STD
    np.testing.assert_allclose(normalize(image).numpy()[0, 0], expected, atol=1e-6)
    np.testing.assert_allclose(normalize(image.astype(np.float32) / 255).numpy()[0, 0], expected,
                               atol=1e-6)


def test_pretext_shapes_and_determinism(cifar):
    x, _ = cifar
    a = _take(pretext_dataset(x, 64, seed=5), 3)
    b = _take(pretext_dataset(x, 64, seed=5), 3)
    c = _take(pretext_dataset(x, 64, seed=6), 1)
    (x0, tx0), p0 = a[0]
    assert x0.shape == tx0.shape == (64, 32, 32, 3) and x0.dtype == tx0.dtype == np.float32
    assert p0.shape == (64, 8) and p0.dtype == np.float32
    for u, v in zip(a, b, strict=True):
        tf.nest.map_structure(np.testing.assert_array_equal, u, v)
    assert np.abs(c[0][1] - p0).max() > 0.1 and np.abs(c[0][0][0] - x0).max() > 0.1
    # successive batches differ, and the repeated stream goes past one epoch (512 / 64 = 8)
    assert np.abs(a[1][1] - a[0][1]).max() > 0.1
    assert len(_take(pretext_dataset(x, 64, seed=5), 12)) == 12


def test_params_are_the_applied_homography(cifar):
    """augment off: x == normalize(image); re-warping x with params_to_matrix(params) gives tx."""
    images, _ = cifar
    ds = pretext_dataset(images[:100], 32, seed=1, training=False, augment=False, repeat=False,
                         drop_remainder=False)
    batches = _take(ds, 10)
    assert [len(p) for _, p in batches] == [32, 32, 32, 4]  # partial last batch kept
    (x, tx), params = batches[0]
    np.testing.assert_allclose(x, normalize(images[:32]).numpy(), atol=1e-6)
    rewarped = warp(images[:32].astype(np.float32) / 255, params_to_matrix(params),
                    fill_value=AETV1_FILL).numpy()
    err = np.abs(rewarped - _raw(tx)).max()
    print(f"re-warp max |err| = {err:.2e}")
    assert err < 1e-5
    # pixels far outside the warped quadrilateral are AETv1's grey, 128/255
    t = params_to_matrix(params.astype(np.float64)).numpy()
    assert np.abs(t).max() < 2.0
    outside = np.isclose(_raw(tx), AETV1_FILL, atol=1e-5).all(-1)
    assert outside.any()


def test_rotation_index_matches_params(cifar):
    images, _ = cifar
    ds = pretext_dataset(images, 128, seed=2, training=False, with_rotation=True)
    (_, _), (params, k) = _take(ds, 1)[0]
    assert k.dtype == np.int32 and set(np.unique(k)) <= {0, 1, 2, 3}
    # the top-left corner lands in the quadrant of canonical corner (0 - k) mod 4 (CCW turns)
    t = params_to_matrix(params.astype(np.float64)).numpy()
    moved = t @ np.array([-1.0, -1.0, 1.0])
    quadrant = np.sign(moved[:, :2] / moved[:, 2:])
    np.testing.assert_array_equal(quadrant, CANONICAL_CORNERS[(-k) % 4])


def test_augmentation_is_padded_crop_and_flip(cifar):
    """Each augmented x is exactly one of the 9 x 9 x 2 zero-padded crops/flips of its image."""
    images, _ = cifar
    (x, _), _ = _take(pretext_dataset(images[:16], 16, seed=3, training=False), 1)[0]
    raw = _raw(x)
    found = set()
    for i in range(16):
        padded = np.pad(images[i].astype(np.float32) / 255, [(4, 4), (4, 4), (0, 0)])
        matches = [(oy, ox, f) for oy in range(9) for ox in range(9) for f in (0, 1)
                   if np.abs((padded[oy:oy + 32, ox:ox + 32][:, ::-1] if f else
                              padded[oy:oy + 32, ox:ox + 32]) - raw[i]).max() < 1e-5]
        assert matches, f"sample {i} is not a padded crop/flip of its image"
        found.update(matches)
    assert len({f for _, _, f in found}) == 2 and len(found) > 8


def test_shuffling_covers_every_image_once_per_epoch():
    n = 300
    images = np.broadcast_to((np.arange(n) % 251)[:, None, None, None], (n, 32, 32, 3))
    images = np.ascontiguousarray(images, dtype=np.uint8)
    labels = np.arange(n)
    ds = classification_dataset(images, labels, 128, seed=9, training=True, augment=False)
    batches = _take(ds, 10)
    assert [len(y) for _, y in batches] == [128, 128, 44]
    seen = np.concatenate([y for _, y in batches])
    assert sorted(seen.tolist()) == list(range(n)) and seen[:10].tolist() != list(range(10))
    for xb, yb in batches:  # images travel with their labels
        np.testing.assert_allclose(_raw(xb)[:, 0, 0, 0] * 255, yb % 251, atol=1e-3)
    again = _take(classification_dataset(images, labels, 128, seed=9, training=True,
                                         augment=False), 1)
    np.testing.assert_array_equal(again[0][1], batches[0][1])


def test_classification_eval_keeps_order_and_pixels(cifar):
    images, labels = cifar
    ds = classification_dataset(images, labels, 100, seed=0, training=False)
    batches = _take(ds, 10)
    assert [len(y) for _, y in batches] == [100] * 5 + [12]
    x = np.concatenate([b[0] for b in batches])
    y = np.concatenate([b[1] for b in batches])
    np.testing.assert_array_equal(y, labels)
    assert y.dtype == np.int64 and x.dtype == np.float32
    np.testing.assert_allclose(x, normalize(images).numpy(), atol=1e-6)
    train = _take(classification_dataset(images, labels, 100, seed=0, training=True), 1)[0][0]
    assert train.shape == (100, 32, 32, 3)


def test_dataset_input_matches_array_input(cifar):
    images, labels = cifar
    from_arrays = _take(pretext_dataset(images, 64, seed=4, training=False, augment=False), 2)
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    from_dataset = _take(pretext_dataset(ds, 64, seed=4, training=False, augment=False), 2)
    for u, v in zip(from_arrays, from_dataset, strict=True):
        tf.nest.map_structure(np.testing.assert_array_equal, u, v)


def _variable_size_dataset():
    rng = np.random.default_rng(0)
    shapes = [(300, 400), (256, 500), (260, 260), (500, 280), (240, 320), (257, 300)]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    return tf.data.Dataset.from_generator(
        lambda: ((im, np.int64(i)) for i, im in enumerate(images)),
        output_signature=(tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([], tf.int64)),
    ), images


def test_imagenet_protocol_pretext_and_eval():
    ds, images = _variable_size_dataset()
    pre = pretext_dataset(ds, 3, seed=0, image_size=224, repeat=False)
    batches = _take(pre, 5)
    assert len(batches) == 2
    (x, tx), params = batches[0]
    assert x.shape == tx.shape == (3, 224, 224, 3) and params.shape == (3, 8)
    again = _take(pretext_dataset(ds, 3, seed=0, image_size=224, repeat=False), 1)[0]
    tf.nest.map_structure(np.testing.assert_array_equal, batches[0], again)
    # evaluation: resize the shorter side to 256, centre crop 224, no shuffling
    ev = _take(classification_dataset(ds, None, 4, seed=0, training=False, image_size=224), 5)
    assert [len(y) for _, y in ev] == [4, 2] and ev[0][1].tolist() == [0, 1, 2, 3]
    assert resize_shorter_side(images[0], 256).numpy().shape == (256, 341, 3)
    resized = resize_shorter_side(images[3], 256).numpy()  # 500 x 280 -> 457 x 256
    assert resized.shape == (457, 256, 3)
    expected = normalize(resized[116:340, 16:240]).numpy()
    # the pipeline resizes only the crop's window: the same pixels up to float rounding
    np.testing.assert_allclose(ev[0][0][3], expected, atol=2e-4)
    tr = _take(classification_dataset(ds, None, 6, seed=1, training=True, image_size=224), 1)
    assert tr[0][0].shape == (6, 224, 224, 3) and sorted(tr[0][1].tolist()) == list(range(6))


def test_bad_inputs():
    with pytest.raises(ValueError, match="images must be"):
        pretext_dataset(np.zeros((4, 28, 28, 3), np.uint8), 2, seed=0)
    with pytest.raises(ValueError, match="labels"):
        classification_dataset(np.zeros((4, 32, 32, 3), np.uint8), np.zeros(3), 2, seed=0,
                               training=False)
