"""Numerical faults, in-process: the training program's own loss, optimizer and run control.

`model.fit` runs the real AET model head (`build_aet_model`, on a tiny encoder so that each fit
takes a second), `GeodesicLoss`, the `SkipNonFinite` Adam of `optimizers.build_optimizer` and the
run control of `pretext_stage.train` (`RunControl`: `NonFiniteSteps`, `CheckpointSaver`). Faults:

- a step whose loss and gradient are non-finite (a batch with an infinite sample weight; the
  forward pass stays finite): `--on_nonfinite=skip` leaves weights, slots and the step counter
  untouched, `--on_nonfinite=stop` ends training; the step is logged; checkpoints stay finite;
- a batch of NaN images, which also poisons BatchNorm's moving statistics in the forward pass
  (no optimizer can undo that): the checkpoint is refused, training stops, the last good
  checkpoint stays the newest;
- adversarial decoder outputs under `mixed_bfloat16` (float32: tests/test_losses.py).

Uint8 images cannot hold a NaN, so these faults cannot be injected through the command line.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from aetv2_tf.method import losses, optimizers
from aetv2_tf.models import build_aet_model
from aetv2_tf.models.blocks import FusedBatchNormalization
from aetv2_tf.program.checkpoint_saver import CheckpointSaver
from aetv2_tf.program.divergence import NonFiniteSteps
from aetv2_tf.program.keras_checkpoints import KerasCheckpoints, list_checkpoints
from aetv2_tf.program.run_control import RunControl
from tests.numerics import adversarial_pairs

BATCH, SIZE = 4, 8
# model.fit on a tf.data.Dataset warns that its default shuffle=True does not apply.
pytestmark = pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning")


def tiny_aet_model() -> keras.Model:
    """`build_aet_model` on a one-conv encoder with the NIN's fused BatchNorm (seeded)."""
    keras.utils.set_random_seed(0)
    image = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Conv2D(8, 3, padding="same")(image)
    x = keras.layers.ReLU()(FusedBatchNormalization()(x))
    return build_aet_model(keras.Model(image, {"block4": x}), feature="block4")


def batch(seed: int, *, nan_images: bool = False, nan_param: bool = False,
          weight: float = 1.0):
    """One ((x, t(x)), params, sample_weight) batch; optionally with a fault."""
    rng = np.random.default_rng(seed)
    x, tx = rng.normal(size=(2, BATCH, SIZE, SIZE, 3)).astype(np.float32)
    params = (np.float32([1, 0, 0, 0, 1, 0, 0, 0]) +
              0.1 * rng.normal(size=(BATCH, 8))).astype(np.float32)
    if nan_images:
        x[0, 0, 0, 0] = np.nan
    if nan_param:
        params[1, 2] = np.nan  # a degenerate homography: the loss drops this sample
    weights = np.ones(BATCH, np.float32)
    weights[0] = weight
    return (x, tx), params, weights


def fit(batches: list, tmp_path, stop_on_skip: bool = False):
    """Trains on `batches` as `pretext_stage.train` does; returns (model, optimizer, checkpoint
    store)."""
    model = tiny_aet_model()
    schedule = optimizers.Schedule("constant", 1e-3, len(batches))
    optimizer = optimizers.build_optimizer("adam", schedule)
    model.compile(optimizer=optimizer, loss=losses.GeodesicLoss(), jit_compile=False)
    optimizer.build(model.trainable_variables)
    store = KerasCheckpoints(str(tmp_path / "checkpoints"), keep=100)
    # the step: batches consumed, skipped ones included
    control = RunControl(0, len(batches), len(batches), saver=CheckpointSaver(store, every=1),
                         nonfinite=NonFiniteSteps(stop_on_skip))
    data = tf.data.Dataset.from_generator(
        lambda: iter(batches), output_signature=tf.nest.map_structure(
            lambda a: tf.TensorSpec(a.shape, tf.float32), batches[0]))
    model.fit(data, epochs=1, steps_per_epoch=len(batches), callbacks=[control], verbose=0)
    return model, optimizer, store


def checkpoint_steps_all_finite(store) -> list[int]:
    """The steps of every checkpoint written, after checking each holds only finite values."""
    import h5py

    def check(name, item):
        if isinstance(item, h5py.Dataset) and np.issubdtype(item.dtype, np.floating):
            assert np.all(np.isfinite(item[()])), f"{path}: {name}"

    steps = []
    for step, path in list_checkpoints(store.directory):
        with h5py.File(path, "r") as f:
            f.visititems(check)
        steps.append(step)
    return steps


def state(model, optimizer) -> list[np.ndarray]:
    """Trainable weights and Adam slots (what a skipped step must leave untouched)."""
    return [v.numpy() for v in model.trainable_weights + optimizer.inner_optimizer.variables]


def test_nonfinite_step_is_skipped_logged_and_never_checkpointed(tmp_path, caplog):
    """Batches ok, NaN-param, non-finite, ok: the non-finite step is skipped, exactly as if its
    batch were absent (the NaN-param sample is merely dropped by the loss)."""
    good = [batch(0), batch(1, nan_param=True), batch(3)]
    with caplog.at_level(logging.ERROR):
        model, optimizer, store = fit(good[:2] + [batch(2, weight=np.inf)] + good[2:],
                                        tmp_path / "faulty")
    assert int(optimizer.skipped_steps.numpy()) == 1
    assert int(optimizer.iterations.numpy()) == 3  # updates applied; 4 batches consumed
    assert "1 step(s) skipped by step 3" in caplog.text
    assert checkpoint_steps_all_finite(store) == [1, 2, 3, 4]
    clean_model, clean_optimizer, _ = fit(good, tmp_path / "clean")
    for got, want in zip(state(model, optimizer), state(clean_model, clean_optimizer),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def test_on_nonfinite_stop_ends_training_at_the_last_good_checkpoint(tmp_path, caplog):
    batches = [batch(0), batch(1), batch(2, weight=np.inf), batch(3), batch(4)]
    with caplog.at_level(logging.ERROR):
        model, optimizer, store = fit(batches, tmp_path, stop_on_skip=True)
    assert int(optimizer.iterations.numpy()) == 2
    assert "1 step(s) skipped by step 3" in caplog.text
    assert "--on_nonfinite=stop: ending training" in caplog.text
    assert checkpoint_steps_all_finite(store) == [1, 2, 3]  # 3: the bad batch consumed
    assert all(np.all(np.isfinite(w)) for w in state(model, optimizer))


def test_nan_images_never_reach_a_checkpoint(tmp_path, caplog):
    """NaN images make the gradient NaN (skipped) and BatchNorm's moving statistics NaN: the
    next checkpoint is refused, training stops, ckpt-2 stays the newest."""
    batches = [batch(0), batch(1), batch(2, nan_images=True), batch(3), batch(4)]
    with caplog.at_level(logging.ERROR):
        model, optimizer, store = fit(batches, tmp_path)
    assert int(optimizer.skipped_steps.numpy()) == 1
    assert "Non-finite weights at step 3: checkpoint NOT written" in caplog.text
    assert checkpoint_steps_all_finite(store) == [1, 2]
    assert store.latest_step() == 2
    assert int(optimizer.iterations.numpy()) == 2  # stopped at the refused checkpoint


# --------------------------------------------------------------- adversarial outputs, bfloat16
@pytest.fixture(scope="module")
def bfloat16_decoder():
    """A Dense decoder computing in bfloat16 (mixed_bfloat16 policy), initialised to the
    identity: its output is its input rounded to bfloat16. The global policy is reset after."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        decoder = keras.Sequential([keras.Input((8,)), keras.layers.Dense(
            8, kernel_initializer="identity", bias_initializer="zeros")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return decoder


@pytest.mark.parametrize("name,y_true,y_pred", adversarial_pairs(),
                         ids=[x[0] for x in adversarial_pairs()])
def test_adversarial_bfloat16_outputs_give_finite_loss_and_gradient(
        name, y_true, y_pred, bfloat16_decoder):
    with tf.GradientTape() as tape:
        output = bfloat16_decoder(y_pred[None])
        tape.watch(output)
        value = losses.GeodesicLoss()(y_true[None], output)
    grads = tape.gradient(value, [output, *bfloat16_decoder.trainable_variables])
    assert output.dtype == tf.bfloat16 and value.dtype == tf.float32
    assert np.isfinite(float(value)), name
    for grad in grads:
        assert np.all(np.isfinite(tf.cast(grad, tf.float32).numpy())), name
    if name.startswith("t R90"):  # the optimum and the quarter/half turns, up to rounding
        expected = [0, np.pi / 2, np.pi, np.pi / 2][int(name[-1])]
        assert float(value) == pytest.approx(expected, abs=0.05), name
