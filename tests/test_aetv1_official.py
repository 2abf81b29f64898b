"""The published AETv1 code's regression targets (`geometry.aetv1_official_targets`): checked
against an independent float64 solve written from its dataset code (the 8x8 system of
`find_coeffs` for PIL's output -> input map of the moved corners), and against PIL itself."""

import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.data.homographies import sample_homographies
from aetv2_tf.method import geometry

MEAN = np.array([0, 0, 16, 0, 0, 16, 0, 0], np.float64)
STD = np.array([1, 1, 20, 1, 1, 20, 0.015, 0.015], np.float64)


def reference_targets(t: np.ndarray, size: int) -> np.ndarray:
    """float64, one homography at a time: where T moves the image corners, in PIL's
    corner-origin pixel frame, then the 8 coefficients that map those moved corners back onto
    (0, 0), (W, 0), (W, H), (0, H) (PIL's PERSPECTIVE data: output -> input), normalised."""
    half = size / 2.0
    model_corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float64)
    out = []
    for m in t:
        moved = (m @ np.c_[model_corners, np.ones(4)].T).T
        moved = moved[:, :2] / moved[:, 2:] * half + half  # PIL pixel coordinates
        target = (model_corners + 1) * half
        rows, rhs = [], []
        for (x, y), (u, v) in zip(moved, target, strict=True):
            rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
            rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
            rhs += [u, v]
        out.append((np.linalg.solve(np.array(rows), np.array(rhs)) - MEAN) / STD)
    return np.array(out)


@pytest.mark.parametrize("size", [32, 224])
def test_targets_match_an_independent_solve_and_round_trip(size):
    t = sample_homographies(64, size, size, seed=3).numpy().astype(np.float64)
    params = t.reshape(-1, 9)[:, :8] / t.reshape(-1, 9)[:, 8:]
    got = np.asarray(geometry.aetv1_official_targets(params, size))
    np.testing.assert_allclose(got, reference_targets(t, size), rtol=1e-9, atol=1e-9)
    back = np.asarray(geometry.params_from_aetv1_official_targets(got, size))
    np.testing.assert_allclose(back, params, rtol=1e-9, atol=1e-9)
    identity = np.array([[1, 0, 0, 0, 1, 0, 0, 0]], np.float64)
    np.testing.assert_allclose(np.asarray(geometry.aetv1_official_targets(identity, size)),
                               [[1, 0, -0.8, 0, 1, -0.8, 0, 0]], atol=1e-12)


def test_pil_with_the_targets_warps_like_our_warp():
    """PIL's own PERSPECTIVE transform, fed the de-normalised targets, moves the image as our
    `warp` with T does (nearest-neighbour on a smooth image: within a few grey levels inside)."""
    from PIL import Image

    from aetv2_tf.data.homographies import warp

    size = 32
    yy, xx = np.mgrid[0:size, 0:size]
    image = np.stack([xx * 8, yy * 8, (xx + yy) * 4], -1).astype(np.uint8)
    t = sample_homographies(8, size, size, seed=5).numpy().astype(np.float64)
    params = t.reshape(-1, 9)[:, :8] / t.reshape(-1, 9)[:, 8:]
    coeffs = np.asarray(geometry.aetv1_official_targets(params, size)) * STD + MEAN
    ours = warp(tf.constant(image[None].repeat(8, 0), tf.float32) / 255.0,
                tf.constant(t, tf.float32), interpolation="bilinear").numpy() * 255.0
    for k in range(8):
        pil = np.asarray(Image.fromarray(image).transform(
            (size, size), Image.Transform.PERSPECTIVE, tuple(coeffs[k]),
            Image.Resampling.BILINEAR), np.float64)
        inside = np.asarray(Image.fromarray(np.full((size, size), 255, np.uint8)).transform(
            (size, size), Image.Transform.PERSPECTIVE, tuple(coeffs[k]),
            Image.Resampling.NEAREST)) == 255
        inside[[0, -1], :] = inside[:, [0, -1]] = False
        assert inside.mean() > 0.4
        assert np.median(np.abs(pil - ours[k])[inside]) <= 4.0


def test_the_loss_is_the_plain_mse_on_the_decoders_output():
    """With `build_aet_model(target="official")` the decoder's raw output r is the official
    target: the loss of T_hat = FromAETv1Targets(r) is mean((r - targets(T))^2), value and
    gradient with respect to r (as the published code's nn.MSELoss on its network's output)."""
    import keras

    from aetv2_tf.method.losses import ParameterMSELoss
    from aetv2_tf.models.aet import FromAETv1Targets

    t = sample_homographies(16, 32, 32, seed=9).numpy()
    params = (t.reshape(-1, 9)[:, :8] / t.reshape(-1, 9)[:, 8:]).astype(np.float32)
    want_targets = np.asarray(geometry.aetv1_official_targets(params.astype(np.float64), 32))
    raw = tf.Variable(want_targets + np.random.default_rng(0).normal(0, 0.3, (16, 8)),
                      dtype=tf.float32)
    loss = ParameterMSELoss(target="official", image_size=32)
    with tf.GradientTape() as tape:
        value = loss(params, FromAETv1Targets(32)(raw))
    grad = tape.gradient(value, raw).numpy()
    residual = raw.numpy().astype(np.float64) - want_targets
    np.testing.assert_allclose(float(value), np.mean(residual ** 2), rtol=1e-4)
    np.testing.assert_allclose(grad, 2 * residual / residual.size, rtol=2e-3, atol=1e-6)
    with pytest.raises(ValueError, match="std=None"):
        ParameterMSELoss(std=[1.0] * 8, target="official")
    assert keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss)) \
        .target == "official"


def test_the_official_model_starts_at_the_identity():
    from aetv2_tf.models import build_backbone
    from aetv2_tf.models.aet import build_aet_model

    model = build_aet_model(build_backbone("nin", (32, 32, 3)), target="official")
    bias = model.get_layer("decoder").bias.numpy()
    np.testing.assert_allclose(bias, [1, 0, -0.8, 0, 1, -0.8, 0, 0], atol=1e-6)
    x = np.zeros((2, 32, 32, 3), np.float32)
    out = np.asarray(model([x, x]))
    np.testing.assert_allclose(out, np.tile([1, 0, 0, 0, 1, 0, 0, 0], (2, 1)), atol=0.05)
    with pytest.raises(ValueError, match="param_scale"):
        build_aet_model(build_backbone("nin", (32, 32, 3)), target="official",
                        param_scale=[1.0] * 8)


@pytest.mark.slow
def test_the_official_config_trains_on_the_command_line(tmp_path, cifar10_dir):
    """configs/cifar10_aetv1_official.cfg end to end (a few steps): the official targets, the
    per-branch BatchNorm, a finite loss, the flags recorded."""
    import json

    from tests.cli import run_module

    proc = run_module("aetv2_tf.train", "--flagfile=configs/cifar10_aetv1_official.cfg",
                      f"--model_dir={tmp_path / 'run'}", f"--data_dir={cifar10_dir}",
                      "--batch_size=16", "--train_examples=256", "--epochs=0",
                      "--train_steps=4", "--verbose=0", "--mixed_precision=none",
                      "--export=false", "--checkpoint_every_steps=4")
    assert "Done (pretext)" in proc.stdout, proc.stdout[-2000:]
    saved = json.loads((tmp_path / "run" / "flags.json").read_text())
    assert (saved["mse_target"], saved["siamese_batch_norm"], saved["loss"]) == \
        ("official", "per_branch", "mse")
