"""Learning-rate schedules, the non-finite step guard and coupled weight decay."""

from __future__ import annotations

import pathlib
import shutil

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


def _pytorch_steps(name: str, w0: np.ndarray, grads: list, lr: float, wd: float) -> np.ndarray:
    """float64 ``torch.optim.SGD(momentum=0.9, nesterov=True, weight_decay=wd)`` or
    ``torch.optim.Adam(betas=(0.9, 0.999), weight_decay=wd)`` (Keras's epsilon 1e-7, added to
    sqrt(v) before the bias correction) from ``w0`` through the data gradients ``grads``; the
    constants as float32 holds them (the optimizer's arithmetic is float32)."""
    mu, b1, b2, eps, lr, wd = (float(np.float32(c)) for c in (0.9, 0.9, 0.999, 1e-7, lr, wd))
    w, buf, m, v = w0.astype(np.float64), None, 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        d = g + wd * w  # coupled: before the momentum / the moments
        if name == "sgd":
            buf = d if buf is None else mu * buf + d
            w = w - lr * (d + mu * buf)
        else:
            m, v = b1 * m + (1 - b1) * d, b2 * v + (1 - b2) * d * d
            w = w - lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
    return w


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_coupled_weight_decay_is_pytorchs_weight_decay(name):
    """`build_optimizer(weight_decay_mode="l2")`: PyTorch's ``weight_decay`` (``g + wd w``
    through the momentum or Adam's moments), on variables shaped as a kernel, a bias and
    BatchNorm's gamma and beta, against a float64 reference of five steps."""
    rng = np.random.default_rng(1)
    shapes, lr, wd = [(3, 4), (4,), (4,), (4,)], 0.05, 0.1
    initial = [rng.normal(size=s) for s in shapes]
    grads = [[rng.normal(size=s) for s in shapes] for _ in range(5)]
    variables = [keras.Variable(w.astype(np.float32)) for w in initial]
    opt = optimizers.build_optimizer(name, lr, weight_decay=wd)
    for step in grads:
        opt.apply([keras.ops.convert_to_tensor(g.astype(np.float32)) for g in step], variables)
    for i, variable in enumerate(variables):
        want = _pytorch_steps(name, initial[i], [step[i] for step in grads], lr, wd)
        no_decay = _pytorch_steps(name, initial[i], [step[i] for step in grads], lr, 0.0)
        assert np.max(np.abs(want - no_decay)) > 1e-3  # the decay is seen
        # Adam's float32 bias correction sqrt(1 - 0.999^t) is good to ~1e-5 relative (the
        # cancellation of 1 - 0.999^t): ~1e-6 of these five steps of lr 0.05
        atol = 5e-6 if name == "adam" else 2e-7
        np.testing.assert_allclose(variable.numpy(), want, rtol=2e-6, atol=atol)


def _tiny_model(regularizer=None) -> keras.Model:
    """Dense -> BatchNormalization -> Dense (seeded; the first bias, which BatchNorm hides from
    the data loss, starts at 1: only the decay moves it), every trainable weight carrying
    ``regularizer`` (a `keras.regularizers` object, or None)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, bias_initializer="ones"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    for weight in model.trainable_weights:
        weight.regularizer = regularizer
    return model


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_coupled_weight_decay_trains_as_an_l2_regularizer_on_every_weight(name):
    """``fit`` with the optimizer's decay ``wd`` follows the trajectory of the L2 penalty
    ``wd / 2 ||w||^2`` as a Keras regularizer on every trainable weight (kernels, biases,
    BatchNorm's gamma and beta) with the same optimizer without decay, to float32 round-off;
    the model itself carries no regularizer and no loss."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
    lr, wd = 0.05, 0.05
    trained = {}
    for path in ("optimizer", "regularizer", "none"):
        model = _tiny_model(keras.regularizers.L2(wd / 2) if path == "regularizer" else None)
        decay = wd if path == "optimizer" else 0.0
        model.compile(optimizer=optimizers.build_optimizer(name, lr, weight_decay=decay),
                      loss="mse", run_eagerly=True)  # four steps: no step to trace
        assert len(model.losses) == (len(model.trainable_weights) if path == "regularizer" else 0)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        trained[path] = [w.numpy() for w in model.trainable_weights]
    assert len(trained["optimizer"]) == 6  # 2 kernels, 2 biases, gamma, beta
    for got, want, plain in zip(*trained.values(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        assert np.max(np.abs(want - plain)) > 1e-4  # the decay is seen


#: Four batches of 4 on two logical CPUs (MirroredStrategy: 2 + 2 a replica) and on one
#: device, the third batch non-finite in its last example only (the second replica's half), with
#: SGD and Adam and the coupled decay 0.1: {optimizer: {run: replicas, weights, skipped_steps,
#: iterations}} as JSON.
MIRRORED_STEPS = """
import json
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
from aetv2_tf.method import optimizers
rng = np.random.default_rng(0)
x, y = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
x[11, 0] = np.nan
runs = {}
for name in ("sgd", "adam"):
    for run, devices in (("mirrored", ["/cpu:0", "/cpu:1"]), ("one", ["/cpu:0"])):
        strategy = tf.distribute.MirroredStrategy(devices)
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                                      keras.layers.Dense(1, bias_initializer="ones")])
            optimizer = optimizers.build_optimizer(name, 0.05, weight_decay=0.1)
            model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        runs.setdefault(name, {})[run] = dict(
            replicas=strategy.num_replicas_in_sync,
            weights=[w.numpy().tolist() for w in model.trainable_weights],
            skipped=int(optimizer.skipped_steps.numpy()),
            iterations=int(optimizer.iterations.numpy()))
print("RESULT", json.dumps(runs))
"""


@pytest.mark.slow
def test_under_mirrored_strategy_the_replicas_skip_together_and_decay_once():
    """MirroredStrategy on two CPUs trains as one device (a fresh interpreter: the logical
    devices are set before TensorFlow starts): the replicas agree to skip the step whose
    non-finite gradient is on one of them only, and the coupled decay is added once, to the
    all-reduced gradient (added on each replica it would count twice: ~1e-2 of the weights
    after these steps, far above the tolerance)."""
    import json
    import subprocess
    import sys

    from tests.cli import REPO

    proc = subprocess.run([sys.executable, "-c", MIRRORED_STEPS], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.split("RESULT ", 1)[1])
    for name in ("sgd", "adam"):
        mirrored, one = runs[name]["mirrored"], runs[name]["one"]
        assert (mirrored["replicas"], one["replicas"]) == (2, 1)
        assert (mirrored["skipped"], mirrored["iterations"]) == (one["skipped"], one[
            "iterations"]) == (1, 3)
        for a, b in zip(mirrored["weights"], one["weights"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
            assert np.all(np.isfinite(a))


def test_the_optimizer_is_rebuilt_from_its_config():
    """A `.keras` file's optimizer: `SkipNonFinite` around `AdamL2` / `SGDL2` comes back with
    its decay and rate; a configuration with a loss scale's settings (fixed at 1: not used)
    loads too, anything else is refused."""
    for name in ("adam", "sgd"):
        optimizer = optimizers.build_optimizer(name, 0.01, weight_decay=5e-4)
        again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        assert type(again) is optimizers.SkipNonFinite
        assert type(again.inner_optimizer) is type(optimizer.inner_optimizer)
        assert again.inner_optimizer.get_config() == optimizer.inner_optimizer.get_config()
        assert optimizers.coupled_l2_decay(again) == 5e-4
    config = {"name": "skip", "initial_scale": 1.0, "dynamic_growth_steps": 2**31 - 1,
              "inner_optimizer": keras.optimizers.serialize(keras.optimizers.Adam(0.01))}
    loaded = optimizers.SkipNonFinite.from_config(config)
    assert loaded.name == "skip" and optimizers.coupled_l2_decay(loaded) == 0.0
    with pytest.raises(TypeError, match="takes inner_optimizer and name"):
        optimizers.SkipNonFinite(keras.optimizers.Adam(0.01), clipnorm=1.0)


#: ``save_weights`` of `_adam_model` (Adam 1e-2) fitted on three batches of 4, the second
#: non-finite (skipped_steps 1, iterations 2), by a `SkipNonFinite` whose ``optimizer`` group
#: holds five variables: iteration, learning rate, skipped_steps, then a loss scale's step
#: counter and scale (1).
LOSS_SCALE_LAYOUT = pathlib.Path(__file__).parent / "data" / "skip_non_finite_adam.weights.h5"


def _adam_model(seed: int):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    model.compile(optimizer=optimizers.build_optimizer("adam", 1e-2), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def _numpy(values) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v) for v in values]


def test_a_checkpoint_holds_the_optimizer_state_once_and_restores_it(tmp_path):
    """`SkipNonFinite` saves its own variables (iteration, learning rate, skipped_steps) under
    ``optimizer`` and the inner optimizer's under ``optimizer/inner_optimizer``: the state
    once, restored exactly; a file of another count is refused."""
    import h5py

    x, y = np.random.default_rng(0).normal(size=(8, 3)), np.ones((8, 1))
    model = _adam_model(0)
    model.fit(x, y, epochs=2, batch_size=4, verbose=0)
    path = tmp_path / "new.weights.h5"
    model.save_weights(path)
    with h5py.File(path) as f:
        own = sorted(f["optimizer"]["vars"].keys(), key=int)
        inner = len(f["optimizer"]["inner_optimizer"]["vars"].keys())
    assert own == ["0", "1", "2"] and inner == len(model.optimizer.inner_optimizer.variables)
    restored = _adam_model(1)
    restored.load_weights(path)
    for a, b in zip(_numpy(model.optimizer.variables), _numpy(restored.optimizer.variables),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(restored.optimizer.iterations.numpy()) == 4
    with h5py.File(path, "a") as f:
        f["optimizer"]["vars"].create_dataset("3", data=np.zeros(()))
    with pytest.raises(ValueError, match="not a checkpoint of this optimizer"):
        _adam_model(1).load_weights(path)


@pytest.mark.parametrize("inner_twice", [False, True], ids=["own", "own_and_inner"])
def test_a_checkpoint_of_the_loss_scaling_layout_resumes(tmp_path, inner_twice):
    """`LOSS_SCALE_LAYOUT` loads: every weight, the inner optimizer's state, `skipped_steps`
    and the step counter as the file holds them, and training goes on from there; so does the
    file with the inner optimizer's variables also after the own five (``inner_twice``)."""
    import h5py

    path = tmp_path / "checkpoint.weights.h5"
    shutil.copyfile(LOSS_SCALE_LAYOUT, path)
    with h5py.File(path, "a") as f:
        own, inner = f["optimizer/vars"], f["optimizer/inner_optimizer/vars"]
        assert len(own) == 5
        slots = len(inner)
        if inner_twice:
            for i in range(slots):
                own.create_dataset(str(5 + i), data=inner[str(i)][()])
    model = _adam_model(1)
    model.load_weights(path)
    with h5py.File(path) as f:
        for layer, group in zip(model.layers, ("dense", "batch_normalization", "dense_1"),
                                strict=True):
            stored = [f[f"layers/{group}/vars/{i}"][()] for i in range(len(layer.weights))]
            for got, want in zip(_numpy(layer.weights), stored, strict=True):
                np.testing.assert_array_equal(got, want)
        inner = [f[f"optimizer/inner_optimizer/vars/{i}"][()] for i in range(slots)]
        for got, want in zip(_numpy(model.optimizer.inner_optimizer.variables), inner,
                             strict=True):
            np.testing.assert_array_equal(got, want)
        skipped = int(f["optimizer/vars/2"][()])
    assert int(model.optimizer.skipped_steps.numpy()) == skipped == 1
    assert int(model.optimizer.iterations.numpy()) == 2
    before = _numpy(model.trainable_weights)
    model.fit(np.ones((4, 3), np.float32), np.zeros((4, 1), np.float32), verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 3
    after = _numpy(model.trainable_weights)
    assert all(np.isfinite(w).all() for w in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
