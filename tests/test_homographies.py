"""Homographies: frames, the AETv1 sampler, and the warp against OpenCV on real CIFAR-10."""

import cv2
import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.data.homographies import (
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
from aetv2_tf.data.sampler import parameter_std
from aetv2_tf.data.sources import load_cifar10
from aetv2_tf.method.geometry import matrix_to_params

SEED = tf.constant([7, 11], tf.int64)


@pytest.fixture(scope="module")
def cifar_test_images(cifar10_dir):
    images, _ = load_cifar10(cifar10_dir, "test")
    return images[:128].astype(np.float32) / 255.0


@pytest.fixture(scope="module")
def components():
    return {k: v.numpy() for k, v in sample_homography_components(20_000, 32, 32, SEED).items()}


def _homogeneous(points):
    return np.concatenate([points, np.ones(points.shape[:-1] + (1,))], axis=-1)


def _apply(m, points):
    """(..., 3, 3) @ (..., n, 2) points -> (..., n, 2)."""
    q = np.einsum("...ij,...nj->...ni", m, _homogeneous(points))
    return q[..., :2] / q[..., 2:]


def test_normalization_matrix_maps_pixel_edges_to_unit_square():
    n = normalization_matrix(32, 24, tf.float64).numpy()
    edges = np.array([[-0.5, -0.5], [23.5, -0.5], [23.5, 31.5], [-0.5, 31.5], [11.5, 15.5]])
    np.testing.assert_allclose(_apply(n, edges), np.vstack([CANONICAL_CORNERS, [[0, 0]]]),
                               atol=1e-12)


def test_worked_example_in_docs():
    """The numbers printed in docs/conventions.md, section "Worked example"."""
    r = rotation_matrix(1, tf.float64)
    np.testing.assert_array_equal(r.numpy(), [[0, 1, 0], [-1, 0, 0], [0, 0, 1]])
    np.testing.assert_allclose(to_pixel_homography(r, 32, 32).numpy(),
                               [[0, 1, 0], [-1, 0, 31], [0, 0, 1]], atol=1e-12)
    np.testing.assert_allclose(corners(r, 32).numpy(),
                               [[-0.5, 31.5], [-0.5, -0.5], [31.5, -0.5], [31.5, 31.5]])
    s = tf.constant(np.diag([1.2, 1.2, 1.0]))
    np.testing.assert_allclose(to_pixel_homography(s, 32, 32).numpy(),
                               [[1.2, 0, -3.1], [0, 1.2, -3.1], [0, 0, 1]], atol=1e-12)
    np.testing.assert_allclose(corners(s, 32).numpy()[[0, 2]], [[-3.7, -3.7], [34.7, 34.7]])
    np.testing.assert_allclose(to_pixel_homography(s @ r, 32, 32).numpy(),
                               [[0, 1.2, -3.1], [-1.2, 0, 34.1], [0, 0, 1]], atol=1e-12)
    np.testing.assert_allclose(matrix_to_params(s @ r).numpy(), [0, 1.2, 0, -1.2, 0, 0, 0, 0])
    quad = CANONICAL_CORNERS.copy()
    quad[0] += 4 / 16
    t = square_to_quad(tf.constant(quad)).numpy()
    np.testing.assert_allclose(t, np.array([[13, -1, 0], [-1, 13, 0], [-1, -1, 14]]) / 14,
                               atol=1e-12)
    h = to_pixel_homography(t, 32, 32).numpy()
    np.testing.assert_allclose(h / h[2, 2], [[0.754902, -0.123529, 3.829412],
                                             [-0.123529, 0.754902, 3.829412],
                                             [-0.003922, -0.003922, 1]], atol=1e-6)
    np.testing.assert_allclose(corners(t, 32).numpy(),
                               [[3.5, 3.5], [31.5, -0.5], [31.5, 31.5], [-0.5, 31.5]], atol=1e-9)


def test_quarter_turns_reproduce_rot90_exactly(cifar_test_images):
    """rotation_matrix(k) (counter-clockwise quarter turns) == np.rot90(x, k), bit for bit."""
    x = cifar_test_images[:16]
    for k in range(4):
        t = rotation_matrix(tf.fill([16], k))
        expected = np.rot90(x, k, axes=(1, 2))
        for interpolation in ("bilinear", "nearest"):
            out = warp(x, t, interpolation=interpolation).numpy()
            np.testing.assert_array_equal(out, expected, err_msg=f"k={k} {interpolation}")


def test_warp_matches_cv2_warp_perspective(cifar_test_images):
    x = cifar_test_images
    fill = 0.5
    t = sample_homographies(len(x), 32, 32, SEED)
    out = warp(x, t, fill_value=fill).numpy()
    h = to_pixel_homography(tf.cast(t, tf.float64), 32, 32).numpy()
    ys, xs = np.mgrid[0:32, 0:32]
    grid = np.stack([xs, ys], -1).reshape(-1, 2).astype(np.float64)
    interior_err, border_err = 0.0, 0.0
    for b in range(len(x)):
        ref = cv2.warpPerspective(x[b], h[b], (32, 32), flags=cv2.INTER_LINEAR,
                                  borderMode=cv2.BORDER_CONSTANT, borderValue=(fill,) * 3)
        src = _apply(np.linalg.inv(h[b]), grid)
        interior = np.all((src >= 1) & (src <= 30), axis=-1).reshape(32, 32)
        err = np.abs(ref - out[b])
        interior_err = max(interior_err, err[interior].max())
        border_err = max(border_err, err.max())
    print(f"warp vs cv2: interior max |err| = {interior_err:.2e}, all pixels {border_err:.2e}")
    assert interior_err < 1e-4
    assert border_err < 1e-3  # per-tap constant fill, like cv2.BORDER_CONSTANT


def test_warp_matches_cv2_on_non_square_images():
    rng = np.random.default_rng(1)
    x = rng.random((8, 24, 40, 3), dtype=np.float32)
    t = sample_homographies(8, 24, 40, SEED, shift="continuous")
    out = warp(x, t, fill_value=0.25).numpy()
    h = to_pixel_homography(tf.cast(t, tf.float64), 24, 40).numpy()
    for b in range(8):
        ref = cv2.warpPerspective(x[b], h[b], (40, 24), flags=cv2.INTER_LINEAR,
                                  borderMode=cv2.BORDER_CONSTANT, borderValue=(0.25,) * 3)
        np.testing.assert_allclose(out[b], ref, atol=1e-4)


def test_warp_direction_moves_a_dot_like_t():
    """A bright pixel at p in x appears at H p in t(x) (T maps original -> transformed)."""
    x = np.zeros((1, 32, 32, 1), np.float32)
    x[0, 5, 20] = 1.0  # (x=20, y=5)
    t = rotation_matrix(tf.ones([1], tf.int32), tf.float64)
    out = warp(x, t, fill_value=0.0).numpy()[0, ..., 0]
    target = _apply(to_pixel_homography(t, 32, 32).numpy()[0], np.array([[20.0, 5.0]]))[0]
    assert np.unravel_index(out.argmax(), out.shape) == (int(target[1]), int(target[0]))
    assert tuple(target) == (5.0, 11.0)  # (y, 31 - x)


def test_sampler_rotation_scale_and_integer_shifts(components):
    k, s, t = components["rotation"], components["scale"], components["matrix"]
    counts = np.bincount(k, minlength=4)
    chi2 = ((counts - len(k) / 4) ** 2 / (len(k) / 4)).sum()
    print(f"rotation counts {counts.tolist()}, chi2 = {chi2:.2f} (3 dof, 0.1% critical 16.27)")
    assert chi2 < 16.27
    assert s.min() >= 0.8 and s.max() <= 1.2 and abs(s.mean() - 1.0) < 0.005
    # corners(T) minus the scaled, cyclically shifted canonical corners: integer pixels in [-4, 4]
    rolled = np.stack([np.roll(CANONICAL_CORNERS, kk, axis=0) for kk in range(4)])[k]
    base = (s[:, None, None] * rolled) * 16.0 + 15.5
    shift = corners(t, 32).numpy() - base
    assert np.abs(shift - np.round(shift)).max() < 2e-3
    shift = np.round(shift)
    assert shift.min() == -4 and shift.max() == 4
    values, counts = np.unique(shift, return_counts=True)
    np.testing.assert_array_equal(values, np.arange(-4, 5))
    assert counts.min() > 0.8 * counts.mean()
    np.testing.assert_allclose(shift, components["shift"], atol=0)
    print(f"scale range [{s.min():.4f}, {s.max():.4f}], shift values {values.tolist()}")


def test_sampler_exact_without_shift():
    """With no corner shift, T is exactly s * rotation_matrix(k) (up to float32 rounding)."""
    c = sample_homography_components(256, 32, 32, SEED, shift_fraction=0.0)
    expected = c["scale"].numpy()[:, None, None] * rotation_matrix(c["rotation"]).numpy()
    expected[:, 2, 2] = 1.0
    np.testing.assert_allclose(c["matrix"].numpy(), expected, atol=1e-6)


def test_sampler_continuous_and_non_square():
    c = sample_homography_components(4000, 24, 40, SEED, shift="continuous")
    d = c["shift"].numpy()
    assert np.abs(d[..., 0]).max() <= 5.0 and np.abs(d[..., 0]).max() > 4.9  # 0.125 * 40
    assert np.abs(d[..., 1]).max() <= 3.0 and np.abs(d[..., 1]).max() > 2.9  # 0.125 * 24
    assert np.abs(d - np.round(d)).max() > 0.4
    i = sample_homography_components(4000, 24, 40, SEED)["shift"].numpy()
    assert np.abs(i[..., 0]).max() == 5 and np.abs(i[..., 1]).max() == 3
    imagenet = sample_homography_components(4000, 224, 224, SEED)["shift"].numpy()
    assert np.abs(imagenet).max() == 28  # AETv1's ImageNet shift
    with pytest.raises(ValueError, match="shift"):
        sample_homographies(2, 32, 32, SEED, shift="subpixel")


def test_sampler_determinism():
    a, ka = sample_homographies(64, 32, 32, SEED, return_rotation=True)
    b, kb = sample_homographies(64, 32, 32, tf.constant([7, 11], tf.int32), return_rotation=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(ka.numpy(), kb.numpy())
    c = sample_homographies(64, 32, 32, tf.constant([7, 12]))
    assert np.abs(a.numpy() - c.numpy()).max() > 0.1
    assert a.dtype == tf.float32 and a.shape == (64, 3, 3)


def test_pixel_homography_agrees_with_corners_and_model_frame_is_order_one(components):
    t = components["matrix"][:2000]
    assert np.abs(t).max() < 2.0 and np.all(t[:, 2, 2] == 1.0)
    h = to_pixel_homography(t.astype(np.float64), 32, 32).numpy()
    pixel_edges = np.array([[-0.5, -0.5], [31.5, -0.5], [31.5, 31.5], [-0.5, 31.5]])
    np.testing.assert_allclose(_apply(h, np.broadcast_to(pixel_edges, (len(t), 4, 2))),
                               corners(t.astype(np.float64), 32).numpy(), atol=1e-9)
    # the model-frame corners are where T sends the canonical square
    moved = _apply(t.astype(np.float64), np.broadcast_to(CANONICAL_CORNERS, (len(t), 4, 2)))
    np.testing.assert_allclose(moved, components["corners"][:2000], atol=1e-5)
    assert np.abs(h[:, :2, 2]).max() > 5  # pixel-frame translations are pixel sized


def test_parameter_std_is_fixed_and_sensible():
    """The decoder's and the AETv1 MSE's scale (`data.sampler.parameter_std`, one function on
    every backend): the same numbers every call, close to the TensorFlow sampler's own std."""
    std = parameter_std(32, "integer")
    np.testing.assert_array_equal(std, parameter_std(32, "integer"))
    assert std.shape == (8,) and std.dtype == np.float32
    # uniform quarter turns: the linear part has std about 0.71 (E[s^2] / 2)
    np.testing.assert_allclose(std[[0, 1, 3, 4]], 0.71, atol=0.02)
    assert 0.05 < std[2] < 0.3 and 0.03 < std[6] < 0.2
    tf_params = matrix_to_params(sample_homographies(100_000, 32, 32, (1234, 5678))).numpy()
    np.testing.assert_allclose(std, tf_params.std(0), rtol=0.02)


def test_usable_inside_tf_data():
    ds = tf.data.Dataset.range(3).map(
        lambda i: warp(tf.ones([4, 32, 32, 3]),
                       sample_homographies(4, 32, 32, tf.stack([i, i + 1])), fill_value=0.0))
    out = list(ds.as_numpy_iterator())
    assert len(out) == 3 and out[0].shape == (4, 32, 32, 3)


def test_int_seeds_are_accepted_and_bad_seeds_named():
    from aetv2_tf.data.homographies import sample_homographies

    by_int = sample_homographies(8, 32, 32, seed=7)
    np.testing.assert_array_equal(by_int, sample_homographies(8, 32, 32, seed=(0, 7)))
    np.testing.assert_array_equal(by_int, sample_homographies(8, 32, 32, seed=np.int64(7)))
    np.testing.assert_array_equal(by_int,
                                  sample_homographies(8, 32, 32, seed=tf.constant([0, 7])))
    assert not np.array_equal(by_int, sample_homographies(8, 32, 32, seed=8))
    for bad in ((1, 2, 3), 1.5, "seven", np.zeros((2, 2), np.int32)):
        with pytest.raises(ValueError, match=r"shape-\(2,\)"):
            sample_homographies(8, 32, 32, seed=bad)
