"""Frozen-encoder classifier probes: freezing, best-validation selection, test-once, splits."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.probes.classifier import (
    build_probe_model,
    probe_optimizer,
    split_train_val,
    step_lr_schedule,
    train_probe,
)
from tests.cli import scalar_events

NUM_CLASSES = 3


def tiny_encoder(seed: int = 0) -> keras.Model:
    """Two Conv-BN-ReLU blocks with dict outputs like build_nin, BN moving stats not trivial."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    block1 = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(6, 3, padding="same", use_bias=False)(block1)
    x = keras.layers.BatchNormalization()(x)
    block2 = keras.layers.ReLU()(x)
    encoder = keras.Model(inputs, {"block1": block1, "block2": block2})
    rng = np.random.default_rng(seed)
    for layer in encoder.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.moving_mean.assign(rng.normal(size=layer.moving_mean.shape) * 0.1)
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, size=layer.moving_variance.shape))
    return encoder


def tiny_head() -> keras.Model:
    inputs = keras.Input((8, 8, 6))
    x = keras.layers.GlobalAveragePooling2D()(inputs)
    # Fast-moving statistics: the restored best epoch must include them (non-trainable weights).
    x = keras.layers.BatchNormalization(momentum=0.5)(x)
    return keras.Model(inputs, keras.layers.Dense(NUM_CLASSES)(x))


def learnable_data(n: int, seed: int):
    """Images whose class is which colour channel is brightest."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=n)
    images = rng.normal(size=(n, 8, 8, 3)).astype(np.float32)
    images[np.arange(n), :, :, labels] += 3.0
    return images, labels.astype(np.int32)


def counted_dataset(images, labels, batch_size, counter, key):
    """A dataset that counts how many times it is iterated (each pass re-calls the generator)."""

    def generator():
        counter[key] = counter.get(key, 0) + 1
        for start in range(0, len(images), batch_size):
            yield images[start : start + batch_size], labels[start : start + batch_size]

    spec = (tf.TensorSpec((None, 8, 8, 3), tf.float32), tf.TensorSpec((None,), tf.int32))
    batches = -(-len(images) // batch_size)
    ds = tf.data.Dataset.from_generator(generator, output_signature=spec)
    return ds.apply(tf.data.experimental.assert_cardinality(batches))


def snapshot(variables):
    return [np.array(v.numpy(), copy=True) for v in variables]


def test_probe_freezes_encoder_selects_best_val_and_tests_once(tmp_path):
    encoder = tiny_encoder()
    before = snapshot(encoder.weights)
    model = build_probe_model(encoder, "block2", tiny_head())

    x_train, y_train = learnable_data(192, 1)
    x_val, y_val = learnable_data(96, 2)
    x_test, y_test = learnable_data(64, 3)
    counter: dict[str, int] = {}
    train_ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(192, seed=0).batch(32)
    val_ds = counted_dataset(x_val, y_val, 32, counter, "val")
    test_ds = counted_dataset(x_test, y_test, 32, counter, "test")

    epochs = 6
    # A sane lr for 4 epochs, then a destructive one: the best epoch is not the last one.
    def schedule(epoch, lr=None):
        return 0.05 if epoch < 4 else 500.0

    result = train_probe(
        model, train_ds, val_ds, test_ds, epochs=epochs,
        optimizer=probe_optimizer(learning_rate=0.05), lr_schedule=schedule,
        model_dir=str(tmp_path / "model"), log_dir=str(tmp_path / "logs"),
    )

    # The encoder is bitwise unchanged (kernels and BN moving statistics); only the head learns.
    after = snapshot(encoder.weights)
    assert len(before) == len(after) == 10  # 2 kernels, 2 x (gamma, beta, mean, var)
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not encoder.trainable
    head_ids = {id(v) for v in model.head.trainable_weights}
    assert {id(v) for v in model.trainable_weights} == head_ids

    # Validation once per epoch, test exactly once.
    assert counter == {"val": epochs, "test": 1}
    assert result["epochs_run"] == epochs

    # The restored weights are those of the best validation epoch (earliest on ties).
    history = result["val_top1_history"]
    assert len(history) == epochs
    assert result["selected_epoch"] == int(np.argmax(history)) + 1
    assert result["selected_epoch"] <= 4, history
    assert max(history[4:]) < max(history), history  # the last epochs really are worse
    assert result["val_top1"] == pytest.approx(max(history))
    assert result["val_top1"] > 60.0, history
    val_logits = model.predict(x_val, batch_size=32, verbose=0)
    restored_acc = 100.0 * np.mean(np.argmax(val_logits, axis=1) == y_val)
    assert restored_acc == pytest.approx(result["val_top1"], abs=1e-6)
    test_logits = model.predict(x_test, batch_size=32, verbose=0)
    assert 100.0 * np.mean(np.argmax(test_logits, axis=1) == y_test) == pytest.approx(
        result["test_top1"], abs=1e-4)
    assert result["test_error"] == pytest.approx(100.0 - result["test_top1"])
    assert result["wall_time_s"] > 0

    assert os.path.isfile(tmp_path / "model" / "best.weights.h5")
    val_scalars = scalar_events(tmp_path / "logs" / "validation")
    assert [step for step, _ in val_scalars["epoch_top1"]] == list(range(epochs))
    np.testing.assert_allclose([v for _, v in val_scalars["epoch_top1"]],
                               np.array(history) / 100.0, rtol=1e-6)
    train_scalars = scalar_events(tmp_path / "logs" / "train")
    assert [v for _, v in train_scalars["epoch_learning_rate"]] == pytest.approx(
        [0.05] * 4 + [500.0] * 2)
    assert scalar_events(tmp_path / "logs" / "test")["top1"] == [
        (result["selected_epoch"], pytest.approx(result["test_top1"]))]
    # epochs.csv (every backend): one row per epoch of THIS run; a rerun starts it anew
    rows = (tmp_path / "logs" / "epochs.csv").read_text().splitlines()
    assert rows[0] == "epoch,loss,top1,val_loss,val_top1,learning_rate"
    assert [r.split(",")[0] for r in rows[1:]] == [str(e) for e in range(1, epochs + 1)]
    np.testing.assert_allclose([float(r.split(",")[4]) for r in rows[1:]],
                               np.array(history) / 100.0, rtol=1e-5)
    train_probe(build_probe_model(encoder, "block2", tiny_head()), train_ds, val_ds, test_ds,
                epochs=2, optimizer=probe_optimizer(learning_rate=0.05),
                log_dir=str(tmp_path / "logs"))
    assert len((tmp_path / "logs" / "epochs.csv").read_text().splitlines()) == 1 + 2


def test_probe_with_feature_function_and_encoder_in_training_mode_elsewhere():
    """A plain feature function works too, and BN of the encoder stays in inference mode."""
    encoder = tiny_encoder(seed=1)
    before = snapshot(encoder.weights)
    features = build_probe_model(encoder, "block2", tiny_head()).features
    x, _ = learnable_data(16, 0)
    want = encoder(x, training=False)["block2"].numpy()
    np.testing.assert_allclose(features(x).numpy(), want, rtol=1e-6, atol=1e-6)

    model = build_probe_model(lambda im: encoder(im, training=False)["block2"], None, tiny_head())
    model.compile(optimizer=probe_optimizer(), loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    x, y = learnable_data(64, 4)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    for b, a in zip(before, snapshot(encoder.weights), strict=True):
        np.testing.assert_array_equal(a, b)


def test_split_train_val_is_disjoint_seeded_and_complete():
    images = np.arange(1000)[:, None] * np.ones((1, 4))
    labels = np.arange(1000) % 10
    split = split_train_val(images, labels, val_examples=150, seed=3)
    assert len(split.val_indices) == 150 and len(split.train_indices) == 850
    assert not set(split.val_indices) & set(split.train_indices)
    assert sorted({*split.val_indices, *split.train_indices}) == list(range(1000))
    np.testing.assert_array_equal(split.val_images[:, 0], split.val_indices)
    np.testing.assert_array_equal(split.train_labels, labels[split.train_indices])
    again = split_train_val(images, labels, val_examples=150, seed=3)
    np.testing.assert_array_equal(again.val_indices, split.val_indices)
    other = split_train_val(images, labels, val_examples=150, seed=4)
    assert not np.array_equal(other.val_indices, split.val_indices)
    with pytest.raises(ValueError, match="val_examples"):
        split_train_val(images, labels, val_examples=1000)


def test_step_schedule_scales_with_epochs():
    s200 = step_lr_schedule(200)
    assert s200.boundaries == [60, 120, 160]
    lrs = [s200(e) for e in (0, 59, 60, 119, 120, 159, 160, 199)]
    np.testing.assert_allclose(lrs, [0.1, 0.1, 0.02, 0.02, 0.004, 0.004, 0.0008, 0.0008])
    assert step_lr_schedule(100).boundaries == [30, 60, 80]


def test_the_probe_optimizer_is_pytorchs_sgd_with_coupled_weight_decay():
    """torch.optim.SGD(nesterov, weight_decay): d = g + wd p; buf = mu buf + d (buf = d at
    first); p -= lr (d + mu buf). The probe's optimiser is Keras SGD (Nesterov) on the gradient
    of the data loss plus ``wd p`` (`optimizers.SGDL2`, the coupled decay)."""
    lr, mu, wd = 0.1, 0.9, 5e-4
    p0 = np.array([1.0, -2.0, 0.5], np.float64)
    targets = [np.array([0.3, -0.1, 0.2]), np.array([-0.5, 0.4, 0.0]), np.array([0.1, 0.1, 0.1])]
    x = np.ones((1, 1), np.float32)
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(3, use_bias=False, name="w")])
    model.get_layer("w").kernel.assign(p0[None].astype(np.float32))
    opt = probe_optimizer(learning_rate=lr, momentum=mu, weight_decay=wd)
    model.compile(optimizer=opt, loss=lambda y, out: keras.ops.sum(y * out))  # grad = y
    p, buf = p0.copy(), None
    for g in targets:
        model.train_on_batch(x, g[None].astype(np.float32))
        d = g + wd * p
        buf = d if buf is None else mu * buf + d
        p = p - lr * (d + mu * buf)
    np.testing.assert_allclose(model.get_layer("w").kernel.numpy()[0], p, rtol=1e-5, atol=1e-6)
