"""Probe classifier heads on frozen features."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.models import AdaptivePooling2D, adaptive_pool_size, build_head

RNG = np.random.default_rng(0)
NIN_BLOCK2 = (8, 8, 192)
ALEXNET_CONVS = {
    "conv1": ((55, 55, 64), 12),
    "conv2": ((27, 27, 192), 7),
    "conv3": ((13, 13, 384), 5),
    "conv4": ((13, 13, 256), 6),
    "conv5": ((13, 13, 256), 6),
}


def _features(shape, batch=2):
    return np.abs(RNG.normal(size=(batch, *shape))).astype("float32")


@pytest.mark.parametrize("kind", ["fc1", "fc2", "fc3", "conv", "linear"])
def test_heads_on_nin_block2(kind):
    head = build_head(kind, NIN_BLOCK2, num_classes=10)
    logits = head(_features(NIN_BLOCK2), training=True)
    assert logits.shape == (2, 10) and logits.dtype == tf.float32
    assert head.layers[-1].name == "logits"


def test_fc_head_structure():
    fc1 = build_head("fc1", NIN_BLOCK2, 10)
    bn = fc1.get_layer("bn")
    assert not bn.center and not bn.scale and bn.moving_mean.shape == (8 * 8 * 192,)
    assert fc1.count_params() == 12288 * 2 + 12288 * 10 + 10  # BN stats + Dense
    fc3 = build_head("fc3", NIN_BLOCK2, 10)
    assert [fc3.get_layer(f"fc{i}").kernel.shape for i in (1, 2)] == [(12288, 200), (200, 200)]
    assert fc3.get_layer("fc1").bias is None
    conv = build_head("conv", NIN_BLOCK2, 10)
    assert conv.get_layer("conv_block_conv1").kernel.shape == (3, 3, 192, 192)


@pytest.mark.parametrize("name", sorted(ALEXNET_CONVS))
def test_linear_heads_on_alexnet_maps(name):
    shape, side = ALEXNET_CONVS[name]
    assert adaptive_pool_size(shape) == side
    head = build_head("linear", shape, num_classes=1000)
    flat = head.get_layer("flatten").output.shape[-1]
    assert flat == side * side * shape[-1]
    assert 8_500 <= flat <= 10_000
    assert head(_features(shape), training=False).shape == (2, 1000)


def test_linear_head_on_nin_and_pool_modes():
    assert adaptive_pool_size(NIN_BLOCK2) == 7
    for pool in ("avg", "max"):
        head = build_head("linear", NIN_BLOCK2, 10, pool=pool)
        assert isinstance(head.get_layer("pool"), AdaptivePooling2D)
        assert head.get_layer("pool").mode == pool
        assert head.get_layer("flatten").output.shape[-1] == 9408
        bn = head.get_layer("bn")
        assert bn.moving_mean.shape == (192,)  # per-channel BN on the pooled map
    assert adaptive_pool_size((4, 4, 64)) == 4  # capped by the map size


@pytest.mark.parametrize(("feature", "extra_convs"), [("conv5", 0), ("conv4", 1)])
def test_nonlinear_alexnet_heads(feature, extra_convs):
    shape = ALEXNET_CONVS[feature][0]
    head = build_head("nonlinear", shape, 1000, batch_norm="keras", extra_convs=extra_convs)
    assert head.get_layer("head_fc6").kernel.shape == (6 * 6 * 256, 4096)
    assert len([la for la in head.layers if la.name.startswith("head_conv")]) == 3 * extra_convs
    assert head(_features(shape, batch=1), training=False).shape == (1, 1000)


def test_fc_heads_accept_vectors_and_fit():
    head = build_head("fc2", (4096,), 5)
    x, y = _features((4096,), batch=8), RNG.integers(0, 5, size=8)
    head.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = head.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


def test_heads_under_mixed_bfloat16_give_float32_logits():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        head = build_head("conv", NIN_BLOCK2, 10)
    finally:
        keras.config.set_dtype_policy(previous)
    assert head(_features(NIN_BLOCK2), training=True).dtype == tf.float32


def test_unknown_kind_rejected():
    with pytest.raises(ValueError, match="head kind"):
        build_head("fc4", NIN_BLOCK2, 10)
