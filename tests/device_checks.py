"""Backend-agnostic checks of the device sampler, warp and pairs layer, shared by
tests/test_device_warp.py.

Imports only numpy, keras and aetv2_tf.data's sampler, warping and layers, so the same code runs
in the pytest process (TensorFlow backend) and in a child process on JAX with TensorFlow blocked:

    KERAS_BACKEND=jax python tests/device_checks.py INPUT.npz OUTPUT.npz

The child reads ``images`` (N, 32, 32, 3) float32 in [0, 1], ``uint8_images`` (16, 32, 32, 3) and
``t`` (N, 3, 3) from INPUT.npz and writes the results of every check to OUTPUT.npz.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the child: JAX, and TensorFlow must not be needed
    os.environ["KERAS_BACKEND"] = "jax"
    sys.modules["tensorflow"] = None
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers, ops  # noqa: E402

from aetv2_tf.data import sampler, warping  # noqa: E402
from aetv2_tf.data.preprocessing_layers import HomographyPairs  # noqa: E402
from aetv2_tf.method.geometry import matrix_to_params  # noqa: E402

SAMPLER_SEED = 2024
NUM_SAMPLES = 20_000
FIT_SEED = 5
FIT_BATCH = 8


def jit(fn):
    """The backend's compiler: ``jax.jit`` or ``tf.function(jit_compile=True)`` (XLA)."""
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)


def rotation_matrices(k: np.ndarray) -> np.ndarray:
    """Exact model-frame quarter turns (counter-clockwise on screen): (B,) -> (B, 3, 3)."""
    c = np.array([1.0, 0.0, -1.0, 0.0], np.float32)[k % 4]
    s = np.array([0.0, 1.0, 0.0, -1.0], np.float32)[k % 4]
    zero, one = np.zeros_like(c), np.ones_like(c)
    return np.stack([np.stack([c, s, zero], -1), np.stack([-s, c, zero], -1),
                     np.stack([zero, zero, one], -1)], -2)


def solve_float64(corners: np.ndarray) -> np.ndarray:
    """Float64 oracle: the 4-point homography (8x8 linear solve) mapping the model-frame square
    ``(-1,-1), (1,-1), (1,1), (-1,1)`` onto ``corners`` (B, 4, 2); (B, 3, 3) with T[2, 2] = 1."""
    src = np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
    dst = corners.astype(np.float64)
    a = np.zeros(dst.shape[:1] + (8, 8))
    for i, (x, y) in enumerate(src):
        u, v = dst[:, i, 0], dst[:, i, 1]
        a[:, 2 * i, :3] = [x, y, 1.0]
        a[:, 2 * i, 6], a[:, 2 * i, 7] = -u * x, -u * y
        a[:, 2 * i + 1, 3:6] = [x, y, 1.0]
        a[:, 2 * i + 1, 6], a[:, 2 * i + 1, 7] = -v * x, -v * y
    rhs = dst.reshape(-1, 8)
    h = np.linalg.solve(a, rhs[..., None])[..., 0]
    return np.concatenate([h, np.ones((len(h), 1))], -1).reshape(-1, 3, 3)


def warp_outputs(images: np.ndarray, t: np.ndarray) -> dict:
    """The warp of fixed inputs, eager and compiled, fill 0.5."""
    eager = ops.convert_to_numpy(warping.warp(images, t, fill_value=0.5))
    compiled = ops.convert_to_numpy(jit(lambda x, m: warping.warp(x, m, fill_value=0.5))(images, t))
    return {"warp_eager": eager, "warp_jit": compiled}


def warp_pairs_outputs(uint8_images: np.ndarray, t: np.ndarray) -> dict:
    """`models.pretext.WarpPairs` (the pair made in the train step from uint8 crops and host
    homographies), mean 0.5 and std 0.25, AETv1's fill: compiled as each program compiles it
    (`jax.jit`; a TF graph, whose fused warp op has no XLA kernel), and its `keras.ops` form
    (``fused=False``, what a TPU compiles) under the backend's XLA compiler."""
    from aetv2_tf.models.pretext import WarpPairs

    t = t[:len(uint8_images)]
    out = {}
    for name, fused in (("pairs", None), ("pairs_xla", False)):
        layer = WarpPairs(mean=(0.5,) * 3, std=(0.25,) * 3, fused=fused)
        compile_fn = jit
        if keras.backend.backend() == "tensorflow" and fused is None:
            import tensorflow as tf

            compile_fn = tf.function
        x, tx = compile_fn(lambda images, m, layer=layer: layer([images, m]))(uint8_images, t)
        out.update({f"{name}_x": ops.convert_to_numpy(x), f"{name}_tx": ops.convert_to_numpy(tx)})
    return out


def rot90_errors(images: np.ndarray) -> dict:
    """Max |warp(x, R_k) - np.rot90(x, k)| for k = 0..3, eager and compiled; also for the sampler
    with no scale and no shift, whose T must be exactly R_k."""
    x = images[:16]
    warp_jit = jit(lambda a, m: warping.warp(a, m, fill_value=0.5))
    eager, compiled = [], []
    for k in range(4):
        t = rotation_matrices(np.full(len(x), k))
        expected = np.rot90(x, k, axes=(1, 2))
        eager.append(np.abs(ops.convert_to_numpy(warping.warp(x, t)) - expected).max())
        compiled.append(np.abs(ops.convert_to_numpy(warp_jit(x, t)) - expected).max())
    t, k = sampler.sample_homographies(len(x), 32, 32, 3, scale_range=(1.0, 1.0),
                                      shift_fraction=0.0)
    t, k = ops.convert_to_numpy(t), ops.convert_to_numpy(k)
    out = ops.convert_to_numpy(warping.warp(x, t))
    sampled = max(np.abs(out[b] - np.rot90(x[b], k[b])).max() for b in range(len(x)))
    return {"rot90_eager": np.array(eager), "rot90_jit": np.array(compiled),
            "rot90_sampled": np.array(sampled), "rot90_sampled_k": k,
            "rot90_sampled_t_err": np.abs(t - rotation_matrices(k)).max()}


def sampler_outputs() -> dict:
    """NUM_SAMPLES components of the sampler (int seed) and their parameters."""
    parts = sampler.sample_homography_components(NUM_SAMPLES, 32, 32, SAMPLER_SEED)
    out = {f"sampler_{k}": ops.convert_to_numpy(v) for k, v in parts.items()}
    out["sampler_params"] = ops.convert_to_numpy(matrix_to_params(parts["matrix"]))
    again = sampler.sample_homographies(4, 32, 32, SAMPLER_SEED)[0]
    out["sampler_repeat"] = ops.convert_to_numpy(again)
    return out


def _energy(y_true, y_pred):
    return ops.mean(ops.square(y_pred), axis=-1)


def build_model(seed: int):
    """A tiny AET-like model on uint8 images: HomographyPairs -> shared conv encoder -> Dense(8).

    Outputs ``resid`` (prediction minus params, trained to 0 with MSE) and ``params`` (no loss;
    its metric ``energy`` = mean(params^2) depends on the homographies only, not on the weights).
    """
    inputs = keras.Input((32, 32, 3), dtype="uint8")
    pairs = HomographyPairs(seed=seed, name="pairs")
    x, tx, params = pairs(inputs)
    init = keras.initializers.GlorotUniform(seed=1)
    encoder = keras.Sequential([layers.Conv2D(4, 3, strides=4, kernel_initializer=init),
                                layers.GlobalAveragePooling2D()])
    pred = layers.Dense(8, kernel_initializer=init)(layers.Concatenate()([encoder(x), encoder(tx)]))
    outputs = {"resid": layers.Subtract(name="resid")([pred, params]),
               "params": layers.Identity(name="params")(params)}
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss={"resid": "mse", "params": None},
                  metrics={"params": [keras.metrics.MeanMetricWrapper(_energy, name="energy")]},
                  jit_compile=True)
    return model, pairs


def fit_outputs(uint8_images: np.ndarray, folder: str) -> dict:
    """Two jitted model.fit steps (batches of FIT_BATCH, no shuffling), then a weights round trip.

    Returns the per-step logged loss and running mean energy, the seed state before and after, the
    weights' change, the energies of the two batches replayed by a fresh layer with the same seed
    (under XLA on TF: its XLA RNG differs from its eager one), and the seed state of a new model
    after ``load_weights`` of the trained one's ``.weights.h5`` (written to ``folder``).
    """
    records = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            records.append({k: float(v) for k, v in (logs or {}).items()})

    y = {"resid": np.zeros((len(uint8_images), 8), np.float32),
         "params": np.zeros((len(uint8_images), 8), np.float32)}
    model, pairs = build_model(FIT_SEED)
    out = {"fit_state0": ops.convert_to_numpy(pairs.seed_generator.state).astype(np.int64)}
    before = [ops.convert_to_numpy(w).copy() for w in model.trainable_weights]
    model.fit(uint8_images, y, batch_size=FIT_BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[Record()])
    after = [ops.convert_to_numpy(w) for w in model.trainable_weights]
    out["fit_state"] = ops.convert_to_numpy(pairs.seed_generator.state).astype(np.int64)
    out["fit_weight_change"] = np.array(
        max(np.abs(a - b).max() for a, b in zip(after, before, strict=True)))
    out["fit_loss"] = np.array([step["loss"] for step in records])
    out["fit_energy"] = np.array([step["params_energy"] for step in records])

    fresh = HomographyPairs(seed=FIT_SEED)
    # TF: XLA's stateless RNG differs from the eager kernels, so replay under XLA; JAX draws the
    # same numbers eagerly and under jit (a plain jax.jit would not advance the seed state).
    call = (lambda images: fresh(images)[2]) if keras.backend.backend() == "jax" \
        else jit(lambda images: fresh(images)[2])
    replay = [ops.convert_to_numpy(call(uint8_images[i:i + FIT_BATCH]))
              for i in range(0, 2 * FIT_BATCH, FIT_BATCH)]
    out["replay_energy"] = np.array([np.mean(np.square(p)) for p in replay])

    path = os.path.join(folder, f"{keras.backend.backend()}.weights.h5")
    model.save_weights(path)
    restored, restored_pairs = build_model(FIT_SEED)
    restored.load_weights(path)
    out["restored_state"] = ops.convert_to_numpy(restored_pairs.seed_generator.state).astype(
        np.int64)
    return out


def loss_step_outputs(uint8_images: np.ndarray) -> dict:
    """`models.pretext.PairsModel(count_steps=True)` under the backend's compiled `model.fit`: a
    loss whose value is `GeodesicLoss(mse_weight=1, mse_decay_steps=3).current_mse_weight()` logs
    1, 2/3, 1/3, 0 on steps 0..3 only if the jitted step reads the counter's traced value; the
    counter ends at the number of steps (4 batches, 2 steps per execution)."""
    from aetv2_tf.method.losses import GeodesicLoss
    from aetv2_tf.models.pretext import build_pairs_model

    inputs = keras.Input((32, 32, 3))
    init = keras.initializers.GlorotUniform(seed=1)
    block = layers.Conv2D(4, 3, strides=4, kernel_initializer=init)(inputs)
    encoder = keras.Model(inputs, {"block4": block}, name="nin")  # a small NIN stand-in
    model = build_pairs_model(encoder, FIT_SEED, count_steps=True)
    decay = GeodesicLoss(mse_weight=1.0, mse_std=[1.0] * 8, mse_decay_steps=3)
    decay.step = model.loss_step
    records = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            records.append(float(logs["loss"]))

    model.compile(optimizer=keras.optimizers.SGD(0.0), steps_per_execution=2,
                  loss=lambda y_true, y_pred: decay.current_mse_weight() + 0.0 * y_pred[:, 0])
    model.fit(uint8_images[:4], batch_size=1, epochs=1, shuffle=False, verbose=0,
              callbacks=[Record()])
    return {"loss_step_running_means": np.array(records),
            "loss_step_final": np.array(int(ops.convert_to_numpy(model.loss_step)))}


def run_all(images: np.ndarray, uint8_images: np.ndarray, t: np.ndarray, folder: str) -> dict:
    out = {"backend": np.array(keras.backend.backend())}
    out.update(warp_outputs(images, t))
    out.update(warp_pairs_outputs(uint8_images, t))
    out.update(rot90_errors(images))
    out.update(sampler_outputs())
    out.update(fit_outputs(uint8_images, folder))
    out.update(loss_step_outputs(uint8_images))
    out["tensorflow_imported"] = np.array(sys.modules.get("tensorflow") is not None)
    return out


if __name__ == "__main__":
    data = np.load(sys.argv[1])
    results = run_all(data["images"], data["uint8_images"], data["t"],
                      os.path.dirname(os.path.abspath(sys.argv[2])))
    np.savez(sys.argv[2], **results)
