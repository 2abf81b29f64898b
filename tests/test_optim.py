"""Learning-rate schedules, the non-finite step guard and coupled weight decay."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from aetv2_tf.method import optimizers


def test_aetv1_schedule_follows_the_published_table():
    # 1500 "epochs" of one step each: the multipliers of the AETv1 code at its epoch boundaries.
    s = optimizers.Schedule("aetv1", 0.1, total_steps=1500)
    expected = {0: 1.0, 239: 1.0, 240: 0.2, 479: 0.2, 480: 0.04, 640: 0.008, 800: 0.0016,
                999: 0.0016}
    for step, mult in expected.items():
        assert float(s(step)) == pytest.approx(0.1 * mult, rel=1e-5), step
    assert float(s(1499)) == pytest.approx(0.1 * 1e-4, rel=5e-2)  # linear decay to ~1e-5


def test_cosine_and_warmup():
    s = optimizers.Schedule("cosine", 1.0, total_steps=100, warmup_steps=10)
    assert float(s(0)) == pytest.approx(0.1, rel=1e-5)  # warm-up: (0 + 1) / 10
    assert float(s(50)) == pytest.approx(0.5, rel=1e-5)
    assert float(s(100)) == pytest.approx(0.0, abs=1e-7)
    assert keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(s)) \
        .get_config() == s.get_config()


def test_step_schedule_drops_at_the_given_epochs():
    """`--lr_drop_epochs=100,150 --lr_drop_factor=0.1` of 200 epochs (the ImageNet pretraining
    config), 10 steps an epoch; and the probes' per-epoch form with RotNet's 5, 15, 25 of 35."""
    s = optimizers.Schedule("step", 1e-4, total_steps=2000, drops=(0.5, 0.75), drop_factor=0.1)
    for step, lr in {0: 1e-4, 999: 1e-4, 1000: 1e-5, 1499: 1e-5, 1500: 1e-6, 1999: 1e-6}.items():
        assert float(s(step)) == pytest.approx(lr, rel=1e-5), step
    assert keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(s)) \
        .get_config() == s.get_config()
    default = optimizers.Schedule("step", 1.0, total_steps=100)
    assert [float(default(i)) for i in (29, 30, 60, 80)] == pytest.approx([1, 0.2, 0.04, 0.008])
    from aetv2_tf.probes.classifier import step_lr_schedule

    rotnet = step_lr_schedule(35, base_lr=0.01, drop_epochs=(5, 15, 25))
    assert [rotnet(e) for e in (0, 4, 5, 14, 15, 25, 34)] == pytest.approx(
        [0.01, 0.01, 0.002, 0.002, 0.0004, 0.00008, 0.00008])


def test_skip_non_finite_leaves_weights_slots_and_step_untouched():
    var = keras.Variable(np.ones(3, np.float32))
    opt = optimizers.build_optimizer("adam", 0.1)
    opt.apply([keras.ops.convert_to_tensor(np.array([1.0, 2.0, 3.0], np.float32))], [var])
    before = [np.array(v) for v in opt.variables] + [np.array(var)]
    opt.apply([keras.ops.convert_to_tensor(np.array([1.0, np.nan, 3.0], np.float32))], [var])
    after = [np.array(v) for v in opt.variables] + [np.array(var)]
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True))
               if not np.array_equal(a, b)]
    assert [opt.variables[i].name for i in changed] == ["skipped_steps"]
    assert int(opt.iterations) == 1 and int(opt.skipped_steps) == 1


def test_l2_decay_gradient_is_coupled_weight_decay():
    """d/dw of the added loss is weight_decay * w for every trainable weight (PyTorch)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization()])
    assert optimizers.add_l2_decay(model, 0.01) == 4
    import tensorflow as tf

    with tf.GradientTape() as tape:
        model(np.ones((2, 4), np.float32))
        penalty = tf.add_n(model.losses)
    grads = tape.gradient(penalty, model.trainable_weights)
    for g, w in zip(grads, model.trainable_weights, strict=True):
        np.testing.assert_allclose(g.numpy(), 0.01 * w.numpy(), rtol=1e-6, atol=1e-8)


def test_skip_mode_stops_a_run_whose_every_step_is_non_finite():
    """Skipping is for the odd bad batch: 10 skipped steps in a row end the run as diverged."""
    from aetv2_tf.program.callbacks import StopOnSkippedStep

    class Model:
        stop_training = False

    opt = optimizers.build_optimizer("sgd", 0.1)
    opt.build([keras.Variable(np.ones(2, np.float32))])
    step = [0]
    callback = StopOnSkippedStep(opt, lambda: step[0], stop=False, patience=10)
    callback.set_model(Model())
    callback.on_train_begin()
    stopped_at = None
    for batch in range(30):
        if batch != 3:  # a good step at batch 3 (the counter does not move) resets the count
            opt.skipped_steps.assign_add(1)
        step[0] = batch + 1
        callback.on_train_batch_end(batch)
        if callback.model.stop_training:
            stopped_at = batch
            break
    assert stopped_at == 13 and callback.diverged  # skips at batches 4..13: ten in a row


def test_a_resumed_run_counts_only_its_own_skipped_steps():
    """`skipped_steps` is restored with the optimizer: the skips of an earlier invocation must
    not stop (--on_nonfinite=stop) or divert a resumed run at its first check."""
    from aetv2_tf.program.callbacks import StopOnSkippedStep

    class Model:
        stop_training = False

    opt = optimizers.build_optimizer("sgd", 0.1)
    opt.build([keras.Variable(np.ones(2, np.float32))])
    opt.skipped_steps.assign(3)  # as restored from a checkpoint
    step = [40]
    callback = StopOnSkippedStep(opt, lambda: step[0], stop=True)
    callback.set_model(Model())
    callback.on_train_begin()
    step[0] = 41
    callback.on_train_batch_end(0)
    assert not callback.model.stop_training and not callback.stopped
    opt.skipped_steps.assign_add(1)
    step[0] = 42
    callback.on_train_batch_end(1)
    assert callback.stopped and callback.model.stop_training


@pytest.mark.parametrize("outcome, code", [({}, 0), ({"interrupted_by": "SIGTERM"}, 143),
                                           ({"interrupted_by": "SIGINT"}, 130),
                                           ({"diverged": True}, 3),
                                           ({"stopped_nonfinite": True}, 3),
                                           ({"nonfinite_weights": True}, 3),
                                           ({"loss_grew": "7.2e+13 at step 8"}, 7)])
def test_exit_codes(outcome, code, capsys):
    from aetv2_tf.train import exit_code

    assert exit_code({"steps": 7, **outcome}) == code
    if code in (3, 7):  # what is kept, named: never "step None"
        err = capsys.readouterr().err
        assert "no checkpoint was written" in err and "None" not in err, err


def _adam_model(seed: int):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer=optimizers.build_optimizer("adam", 1e-2), loss="mse")
    return model


def test_a_checkpoint_holds_the_optimizer_state_once_and_restores_it(tmp_path, monkeypatch):
    """`SkipNonFinite` saves its own variables only (the inner optimizer's are saved under
    ``inner_optimizer``): the state once, not twice, restored exactly; a file written with both
    copies (before) loads too."""
    import h5py

    x, y = np.random.default_rng(0).normal(size=(8, 3)), np.ones((8, 1))
    model = _adam_model(0)
    model.fit(x, y, epochs=2, batch_size=4, verbose=0)
    new, old = tmp_path / "new.weights.h5", tmp_path / "old.weights.h5"
    model.save_weights(new)
    with monkeypatch.context() as m:
        m.setattr(optimizers.SkipNonFinite, "save_own_variables",
                  keras.optimizers.LossScaleOptimizer.save_own_variables)
        model.save_weights(old)

    def stored(path):
        with h5py.File(path) as f:
            return sorted(f["optimizer"]["vars"].keys(), key=int), len(
                f["optimizer"]["inner_optimizer"]["vars"].keys())

    own = len(model.optimizer._variables)
    inner = len(model.optimizer.inner_optimizer.variables)
    assert stored(new) == ([str(i) for i in range(own)], inner)
    assert len(stored(old)[0]) == own + stored(old)[1]
    for path in (new, old):
        restored = _adam_model(1)
        restored.optimizer.build(restored.trainable_variables)
        restored.load_weights(path)
        for a, b in zip(model.optimizer.variables, restored.optimizer.variables, strict=True):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(a),
                                          keras.ops.convert_to_numpy(b))
    with h5py.File(new, "a") as f:
        f["optimizer"]["vars"].create_dataset(str(own), data=np.zeros(()))
    with pytest.raises(ValueError, match="not a checkpoint of this optimizer"):
        _adam_model(1).load_weights(new)
