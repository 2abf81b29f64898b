"""NIN / AlexNet backbones and the AET / RotNet pretext models."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.models import (
    FusedBatchNormalization,
    build_aet_model,
    build_alexnet,
    build_backbone,
    build_nin,
    build_rotation_classifier,
    default_feature,
    identity_params,
    input_side,
)
from aetv2_tf.models.nin import NIN_BLOCK_SPECS, torch_pool

RNG = np.random.default_rng(0)


def _normal_images(batch, size):
    return RNG.normal(size=(batch, size, size, 3)).astype("float32")


def _conv_bn_params(layers, in_channels):
    """Parameters of a chain of bias-free convs + BN (4 vectors each): [(filters, k), ...]."""
    total = 0
    for filters, kernel_size in layers:
        total += kernel_size * kernel_size * in_channels * filters + 4 * filters
        in_channels = filters
    return total, in_channels


def test_one_way_to_build_a_backbone_and_one_to_read_its_side():
    """`build_backbone` is the builder (the API's, the table holds the facts: no `build` on a
    row); the side of the images is read from the encoder once it exists (`input_side`),
    whatever the table's default; any size, not square, or not an image batch: named."""
    import aetv2_tf
    from aetv2_tf.models.backbones import BACKBONES

    assert aetv2_tf.build_backbone is build_backbone
    assert not hasattr(BACKBONES["nin"], "build")
    assert input_side(build_backbone("nin", batch_norm="keras")) == BACKBONES["nin"].input_size
    assert input_side(build_backbone("nin", (48, 48, 3), "keras")) == 48
    any_size = build_backbone("nin", (None, None, 3), "keras")
    assert input_side(any_size, any_size=True) is None
    with pytest.raises(ValueError, match="square images of a known size"):
        input_side(any_size)
    with pytest.raises(ValueError, match=r"inputs of shape \(None, 32, 48, 3\)"):
        input_side(build_backbone("nin", (32, 48, 3), "keras"), any_size=True)
    with pytest.raises(ValueError, match="backbone must be one of"):
        build_backbone("resnet")


def test_nin_shapes_params_and_layer_names():
    model = build_nin()
    outputs = model(_normal_images(2, 32), training=False)
    expected = {"block1": (16, 16, 96), "block2": (8, 8, 192), "block3": (8, 8, 192)}
    expected["block4"] = (8, 8, 192)
    assert {k: tuple(v.shape) for k, v in outputs.items()} == {
        k: (2, *v) for k, v in expected.items()
    }
    total, channels = 0, 3
    for spec in NIN_BLOCK_SPECS:
        params, channels = _conv_bn_params(spec, channels)
        total += params
    assert model.count_params() == total == 1_414_720
    assert isinstance(model.get_layer("block2_conv3_bn"), FusedBatchNormalization)
    for name in ("block1_maxpool", "block2_avgpool", "block3_conv3_relu", "block4_conv3_relu"):
        model.get_layer(name)
    short = build_nin(num_blocks=3, batch_norm="keras")
    assert sorted(short.output) == ["block1", "block2", "block3"]
    assert isinstance(short.get_layer("block1_conv1_bn"), keras.layers.BatchNormalization)


def test_conv_init_std_and_bn_init():
    model = build_nin()
    for name, (filters, kernel_size) in [("block1_conv1", (192, 5)), ("block3_conv2", (192, 1))]:
        kernel = model.get_layer(name).kernel.numpy()
        expected = math.sqrt(2.0 / (kernel_size * kernel_size * filters))
        assert abs(kernel.std() / expected - 1.0) < 0.05
        assert abs(kernel.mean()) < 0.05 * expected
        assert model.get_layer(name).bias is None
    bn = model.get_layer("block1_conv1_bn")
    np.testing.assert_array_equal(bn.gamma.numpy(), 1.0)
    np.testing.assert_array_equal(bn.beta.numpy(), 0.0)


def _numpy_pool_3x3_s2_p1(x: np.ndarray, kind: str) -> np.ndarray:
    """PyTorch Max/AvgPool2d(3, 2, padding=1): -inf padding for max, count_include_pad for avg."""
    pad_value = -np.inf if kind == "max" else 0.0
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=pad_value)
    out_h, out_w = (x.shape[1] - 1) // 2 + 1, (x.shape[2] - 1) // 2 + 1
    y = np.zeros((x.shape[0], out_h, out_w, x.shape[3]), x.dtype)
    for i in range(out_h):
        for j in range(out_w):
            window = padded[:, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3]
            y[:, i, j] = window.max(axis=(1, 2)) if kind == "max" else window.sum(axis=(1, 2)) / 9
    return y


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("size", [8, 7, 32])
def test_pooling_matches_pytorch_padding_semantics(kind, size):
    x = np.abs(RNG.normal(size=(2, size, size, 3))).astype("float32")  # post-ReLU input
    inputs = keras.Input((size, size, 3))
    pool = keras.Model(inputs, torch_pool(inputs, kind, name="p"))
    y = pool(x).numpy()
    reference = _numpy_pool_3x3_s2_p1(x, kind)
    assert y.shape == reference.shape
    np.testing.assert_allclose(y, reference, atol=1e-6)
    if kind == "avg":  # the corner cell averages 4 real pixels over 9, PyTorch's default
        np.testing.assert_allclose(y[:, 0, 0], x[:, :2, :2].sum(axis=(1, 2)) / 9, atol=1e-6)


def test_alexnet_shapes_and_params():
    model = build_alexnet()
    outputs = model(_normal_images(2, 224), training=False)
    expected = {
        "conv1": (55, 55, 64),
        "conv2": (27, 27, 192),
        "conv3": (13, 13, 384),
        "conv4": (13, 13, 256),
        "conv5": (13, 13, 256),
        "fc6": (4096,),
        "fc7": (4096,),
    }
    assert {k: tuple(v.shape) for k, v in outputs.items()} == {
        k: (2, *v) for k, v in expected.items()
    }
    convs, _ = _conv_bn_params([(64, 11), (192, 5), (384, 3), (256, 3), (256, 3)], 3)
    fcs = 9216 * 4096 + 4096 * 4096 + 2 * 4 * 4096
    assert model.count_params() == convs + fcs
    assert np.all(outputs["fc7"].numpy() >= 0.0)
    kernel = model.get_layer("conv2").kernel.numpy()
    assert abs(kernel.std() / math.sqrt(2.0 / (25 * 192)) - 1.0) < 0.05


@pytest.fixture(scope="module")
def small_aet():
    """AET on a NIN for 16x16 inputs (same layers, 4x fewer pixels)."""
    keras.utils.set_random_seed(3)
    encoder = build_nin((16, 16, 3))
    return encoder, build_aet_model(encoder)


def _pair_features(model):
    return keras.Model(model.inputs, model.get_layer("pair_features").output)


def _encoder_features(encoder, images):
    return tf.reduce_mean(encoder(images, training=False)["block4"], axis=(1, 2)).numpy()


def test_aet_shares_one_encoder(small_aet):
    encoder, model = small_aet
    encoder_ids = {id(v) for v in encoder.trainable_variables}
    model_ids = [id(v) for v in model.trainable_variables]
    assert len(model_ids) == len(encoder_ids) + 2 == len(set(model_ids))
    assert encoder_ids <= set(model_ids)
    x, tx = _normal_images(3, 16), _normal_images(3, 16)
    pairs = _pair_features(model)([x, tx], training=False).numpy()
    assert pairs.shape == (3, 384)
    np.testing.assert_allclose(pairs[:, :192], _encoder_features(encoder, x), atol=1e-5)
    np.testing.assert_allclose(pairs[:, 192:], _encoder_features(encoder, tx), atol=1e-5)
    # Perturbing ONE encoder weight moves the features of both branches.
    kernel = encoder.get_layer("block1_conv1").kernel
    original = kernel.numpy()
    kernel.assign(original * 1.5)
    moved = _pair_features(model)([x, tx], training=False).numpy()
    kernel.assign(original)
    assert np.abs(moved[:, :192] - pairs[:, :192]).max() > 1e-3
    assert np.abs(moved[:, 192:] - pairs[:, 192:]).max() > 1e-3


def test_aet_starts_at_identity_and_fits_with_mse(small_aet):
    encoder, model = small_aet
    x, tx = _normal_images(8, 16), _normal_images(8, 16)
    params = model([x, tx], training=False).numpy()
    assert params.dtype == np.float32 and params.shape == (8, 8)
    np.testing.assert_allclose(params, np.tile(identity_params(), (8, 1)), atol=0.1)
    before = encoder.get_layer("block1_conv1").kernel.numpy()
    target = identity_params() + 0.1 * RNG.normal(size=(8, 8)).astype("float32")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    history = model.fit((x, tx), target, batch_size=4, epochs=1, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert not np.allclose(encoder.get_layer("block1_conv1").kernel.numpy(), before)
    # Both branches still read the same (updated) encoder.
    pairs = _pair_features(model)([x, tx], training=False).numpy()
    np.testing.assert_allclose(pairs[:, :192], _encoder_features(encoder, x), atol=1e-5)
    np.testing.assert_allclose(pairs[:, 192:], _encoder_features(encoder, tx), atol=1e-5)


def test_aet_fits_with_geodesic_loss(small_aet):
    losses = pytest.importorskip("aetv2_tf.method.losses")
    _, model = small_aet
    x, tx = _normal_images(4, 16), _normal_images(4, 16)
    target = np.tile(identity_params(), (4, 1))
    target[:, 2] += 0.1  # a small translation
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=losses.GeodesicLoss())
    history = model.fit((x, tx), target, batch_size=2, epochs=1, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def test_aet_save_load_roundtrip(small_aet, tmp_path):
    _, model = small_aet
    x, tx = _normal_images(2, 16), _normal_images(2, 16)
    path = tmp_path / "aet.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    np.testing.assert_allclose(loaded([x, tx]), model([x, tx]), atol=1e-5)


def test_aet_on_alexnet_concatenates_fc7():
    """The one feature rule (`default_feature`): with no `feature=`, AlexNet's AET model
    regresses from fc7 (4096 + 4096) and its RotNet model classifies fc7; NIN's from block4."""
    encoder = build_backbone("alexnet", batch_norm="keras")
    model = build_aet_model(encoder)
    assert model.get_layer("decoder").kernel.shape == (8192, 8)
    params = model([_normal_images(1, 224), _normal_images(1, 224)], training=False)
    assert params.shape == (1, 8)
    assert build_rotation_classifier(encoder).get_layer("rotation_logits").kernel.shape == (4096, 4)
    nin = build_backbone("nin", (32, 32, 3), batch_norm="keras")
    assert default_feature(nin) == "block4" and default_feature(encoder) == "fc7"
    assert build_aet_model(nin).get_layer("decoder").kernel.shape == (384, 8)


def test_default_feature_refuses_an_unknown_encoder():
    image = keras.Input((8, 8, 3))
    other = keras.Model(image, {"block4": keras.layers.Conv2D(4, 3)(image)}, name="other")
    with pytest.raises(ValueError, match="no default feature.*'other'.*pass feature="):
        build_aet_model(other)
    assert build_aet_model(other, feature="block4").get_layer("decoder").kernel.shape == (8, 8)


def test_rotation_model_fits():
    keras.utils.set_random_seed(4)
    model = build_rotation_classifier(build_backbone("nin", input_shape=(16, 16, 3)))
    x, labels = _normal_images(8, 16), RNG.integers(0, 4, size=8)
    logits = model(x, training=False)
    assert logits.shape == (8, 4) and logits.dtype == tf.float32
    model.compile(
        optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    history = model.fit(x, labels, batch_size=4, epochs=1, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def test_mixed_bfloat16_outputs_float32_params():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        encoder = build_backbone("nin", input_shape=(16, 16, 3))
        model = build_aet_model(encoder)
    finally:
        keras.config.set_dtype_policy(previous)
    bn = encoder.get_layer("block2_conv1_bn")
    assert bn.compute_dtype == "bfloat16" and bn.gamma.dtype == "float32"
    features = encoder(_normal_images(2, 16), training=True)["block4"]
    assert features.dtype == tf.bfloat16
    params = model([_normal_images(2, 16), _normal_images(2, 16)], training=False)
    assert params.dtype == tf.float32
    np.testing.assert_allclose(params, np.tile(identity_params(), (2, 1)), atol=0.1)


def test_param_scale_regresses_normalised_parameters_and_starts_at_identity():
    """AETv1: the decoder's own outputs are params / std (O(1)), the model's are the params."""
    import keras

    from aetv2_tf.models import build_aet_model, build_backbone, identity_params

    scale = np.array([0.7, 0.7, 0.1, 0.7, 0.7, 0.1, 0.08, 0.08])
    model = build_aet_model(build_backbone("nin", (32, 32, 3)), param_scale=scale)
    decoder = model.get_layer("decoder")
    np.testing.assert_allclose(decoder.bias.numpy(), identity_params() / scale, rtol=1e-6)
    x = np.random.RandomState(0).randn(2, 32, 32, 3).astype(np.float32)
    out = model((x, x), training=False).numpy()
    np.testing.assert_allclose(out, np.tile(identity_params(), (2, 1)), atol=0.05)
    assert keras.models.clone_model(model).get_layer("decoder_scale") is not None
