"""The device sampler, warp and pairs layer (aetv2_tf.data: sampler, warping, layers) in
keras.ops, on TensorFlow and JAX.

The TensorFlow-backend checks run in this process; the JAX ones run the same code
(tests/device_checks.py) in a child process with KERAS_BACKEND=jax and TensorFlow blocked.
Run with ``-s`` to see the measured errors.
"""

import os
import subprocess
import sys

import cv2
import keras
import numpy as np
import pytest
import tensorflow as tf

import aetv2_tf.data as data
from aetv2_tf.data import homographies, pipelines, sampler, warping
from aetv2_tf.data.constants import AETV1_FILL, CIFAR10_MEAN, CIFAR10_STD
from aetv2_tf.data.preprocessing_layers import HomographyPairs
from aetv2_tf.data.sources import load_cifar10
from aetv2_tf.method.geometry import matrix_to_params
from tests import device_checks as checks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHI2_3DOF_P001 = 16.27  # chi-square quantile, 3 degrees of freedom, p = 0.001


@pytest.fixture(scope="module")
def inputs(cifar10_dir):
    """64 real CIFAR-10 test images in [0, 1], 16 uint8 ones, and 64 sampled T (TF backend)."""
    images, _ = load_cifar10(cifar10_dir, "test")
    t, _ = sampler.sample_homographies(64, 32, 32, 11)
    return {"images": images[:64].astype(np.float32) / 255.0, "uint8_images": images[64:80],
            "t": keras.ops.convert_to_numpy(t)}


@pytest.fixture(scope="module")
def jax_child(inputs, tmp_path_factory):
    """Starts the JAX checks in a child process (`tf_results` starts it first, to overlap with
    the TensorFlow checks, when a selected test reads them: not in the fast tier)."""
    folder = tmp_path_factory.mktemp("jax")
    np.savez(folder / "in.npz", **inputs)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tests", "device_checks.py"),
         str(folder / "in.npz"), str(folder / "out.npz")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
    )
    yield proc, folder
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def tf_results(inputs, tmp_path_factory, request):
    if any("jax_results" in getattr(item, "fixturenames", ()) for item in request.session.items
           if getattr(item, "module", None) is request.module):
        request.getfixturevalue("jax_child")  # started now, read by `jax_results`
    assert keras.backend.backend() == "tensorflow"
    return checks.run_all(inputs["images"], inputs["uint8_images"], inputs["t"],
                          str(tmp_path_factory.mktemp("tf")))


@pytest.fixture(scope="module")
def jax_results(jax_child):
    proc, folder = jax_child
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-4000:]
    results = dict(np.load(folder / "out.npz"))
    assert str(results["backend"]) == "jax"
    return results


def _interior_errors(images, t, out, fill):
    """Max |out - cv2.warpPerspective| over interior pixels (every bilinear tap inside the image,
    where cv2's border handling agrees) and over all pixels."""
    h = homographies.to_pixel_homography(t.astype(np.float64), 32, 32).numpy()
    ys, xs = np.mgrid[0:32, 0:32]
    grid = np.stack([xs, ys, np.ones_like(xs)], -1).reshape(-1, 3).astype(np.float64)
    interior_err = border_err = 0.0
    for b in range(len(images)):
        ref = cv2.warpPerspective(images[b], h[b], (32, 32), flags=cv2.INTER_LINEAR,
                                  borderMode=cv2.BORDER_CONSTANT, borderValue=(fill,) * 3)
        src = grid @ np.linalg.inv(h[b]).T
        src = src[:, :2] / src[:, 2:]
        interior = np.all((src >= 1) & (src <= 30), axis=-1).reshape(32, 32)
        err = np.abs(ref - out[b])
        interior_err = max(interior_err, err[interior].max())
        border_err = max(border_err, err.max())
    return interior_err, border_err


# ------------------------------------------------------------------------------------- (a) warp
def test_warp_matches_cv2_warp_perspective(inputs, tf_results):
    out = tf_results["warp_eager"]
    assert out.shape == (64, 32, 32, 3) and out.dtype == np.float32
    interior, everywhere = _interior_errors(inputs["images"], inputs["t"], out, 0.5)
    jit_interior, _ = _interior_errors(inputs["images"], inputs["t"], tf_results["warp_jit"], 0.5)
    print(f"\nwarping.warp (TF) vs cv2.warpPerspective on 64 CIFAR-10 images: interior max |err| "
          f"{interior:.2e} (XLA {jit_interior:.2e}), all pixels {everywhere:.2e}")
    assert interior < 1e-4 and jit_interior < 1e-4
    assert everywhere < 1e-3  # per-tap constant fill, like cv2.BORDER_CONSTANT


def test_warp_agrees_with_tensorflow_warp_and_fill(inputs):
    x, t = inputs["images"][:8], inputs["t"][:8]
    ours = keras.ops.convert_to_numpy(warping.warp(x, t, fill_value=0.25))
    theirs = homographies.warp(x, t, fill_value=0.25).numpy()
    assert np.abs(ours - theirs).max() < 1e-4
    far = np.diag([0.2, 0.2, 1.0]).astype(np.float32)[None]  # shrinks: the border is all fill
    out = keras.ops.convert_to_numpy(warping.warp(x[:1], far, fill_value=0.25))
    np.testing.assert_array_equal(out[0, :5], 0.25)
    uint8 = (x[:1] * 255).round().astype(np.uint8)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(warping.warp(uint8, t[:1])),
                               keras.ops.convert_to_numpy(warping.warp(uint8 / 255.0, t[:1])),
                               atol=1e-6)


def test_dynamic_batch_in_a_tf_graph(inputs):
    """A TF graph with an unknown batch size (tf.data without drop_remainder) maps per image."""
    x, t = inputs["images"][:8], inputs["t"][:8]
    spec = [tf.TensorSpec([None, 32, 32, 3], tf.float32), tf.TensorSpec([None, 3, 3], tf.float32)]
    graph = tf.function(lambda a, m: warping.warp(a, m, 0.25), input_signature=spec)
    eager = keras.ops.convert_to_numpy(warping.warp(x, t, 0.25))
    np.testing.assert_allclose(graph(x, t).numpy(), eager, atol=1e-6)
    layer = HomographyPairs(seed=1)
    pairs = tf.function(layer, input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.uint8)])
    out = pairs(inputs["uint8_images"])
    assert [tuple(v.shape) for v in out] == [(16, 32, 32, 3), (16, 32, 32, 3), (16, 8)]
    assert np.all(np.isfinite(out[1].numpy()))
    params = out[2].numpy()
    np.testing.assert_allclose(layer.seed_generator.state.numpy(), [1, 1])
    t = np.concatenate([params, np.ones((16, 1), np.float32)], -1).reshape(16, 3, 3)
    mean, std = np.array(CIFAR10_MEAN), np.array(CIFAR10_STD)
    expected = keras.ops.convert_to_numpy(warping.warp(
        (out[0].numpy() * std + mean).astype(np.float32), t, AETV1_FILL))
    np.testing.assert_allclose(out[1].numpy() * std + mean, expected, atol=1e-5)


# -------------------------------------------------------------------------------- (b) rot90
def test_quarter_turns_reproduce_rot90_exactly(tf_results):
    np.testing.assert_array_equal(tf_results["rot90_eager"], 0.0)
    np.testing.assert_array_equal(tf_results["rot90_jit"], 0.0)
    assert tf_results["rot90_sampled_t_err"] == 0.0  # the sampler's k is rotation_matrix(k)
    assert tf_results["rot90_sampled"] == 0.0
    assert set(tf_results["rot90_sampled_k"]) == {0, 1, 2, 3}
    np.testing.assert_array_equal(
        checks.rotation_matrices(np.arange(4)),
        homographies.rotation_matrix(tf.range(4)).numpy())


# ------------------------------------------------------------------------------ (c) sampler
def _check_sampler(results, label):
    c = {k[len("sampler_"):]: v for k, v in results.items() if k.startswith("sampler_")}
    n = checks.NUM_SAMPLES
    assert c["matrix"].shape == (n, 3, 3) and c["matrix"].dtype == np.float32
    assert c["rotation"].dtype == np.int32
    np.testing.assert_array_equal(c["matrix"][:, 2, 2], 1.0)
    # the protocol: corner i = s * canonical corner (i - k) mod 4 + shift, in the model frame
    canonical = homographies.CANONICAL_CORNERS
    source = (np.arange(4)[None] - c["rotation"][:, None]) % 4
    expected = c["scale"][:, None, None] * canonical[source] + c["shift"] * (2.0 / 32)
    np.testing.assert_allclose(c["corners"], expected, atol=1e-6)
    # T maps the square onto the corners; float32 closed form vs float64 solves
    err_np = np.abs(c["matrix"] - checks.solve_float64(c["corners"])).max()
    err_tf = np.abs(c["matrix"] - homographies.square_to_quad(
        c["corners"].astype(np.float64)).numpy()).max()
    # distribution
    counts = np.bincount(c["rotation"], minlength=4)
    chi2 = float(((counts - n / 4) ** 2 / (n / 4)).sum())
    reference = homographies.sample_homographies(200_000, 32, 32, (1234, 5678)).numpy()
    reference = matrix_to_params(reference.astype(np.float64)).numpy()
    mean, std = reference.mean(0), reference.std(0)
    p = c["params"].astype(np.float64)
    mean_dev = np.abs(p.mean(0) - mean) / std
    std_dev = np.abs(p.std(0) / std - 1)
    print(f"\n{label} sampler: float32 solve vs float64 max |err| {err_np:.1e} (numpy), "
          f"{err_tf:.1e} (TF square_to_quad); rotation counts {counts.tolist()} chi2 {chi2:.2f}; "
          f"max |mean diff| {mean_dev.max():.4f} std, max |std ratio - 1| {std_dev.max():.4f}")
    assert err_np < 1e-5 and err_tf < 1e-5
    assert len(counts) == 4 and chi2 < CHI2_3DOF_P001
    assert np.all(mean_dev < 0.03), mean_dev
    assert np.all(std_dev < 0.03), std_dev
    np.testing.assert_array_equal(np.unique(c["shift"][..., 0]), np.arange(-4, 5))
    np.testing.assert_array_equal(np.unique(c["shift"][..., 1]), np.arange(-4, 5))
    assert 0.8 <= c["scale"].min() < 0.801 and 1.199 < c["scale"].max() <= 1.2
    np.testing.assert_array_equal(c["repeat"], c["matrix"][:4])  # an int seed is stateless
    np.testing.assert_allclose(c["params"], matrix_to_params(c["matrix"]).numpy(), atol=1e-7)


def test_sampler_protocol_distribution_and_solve(tf_results):
    _check_sampler(tf_results, "TF")


def test_sampler_continuous_shift_and_generator_seed():
    gen = keras.random.SeedGenerator(3)
    parts = sampler.sample_homography_components(5000, 24, 40, gen, shift="continuous")
    shift = keras.ops.convert_to_numpy(parts["shift"])
    assert np.abs(shift[..., 0]).max() <= 5.0 and np.abs(shift[..., 1]).max() <= 3.0
    assert len(np.unique(shift)) > 1000  # not integers
    first = keras.ops.convert_to_numpy(parts["matrix"])
    second = keras.ops.convert_to_numpy(sampler.sample_homographies(5000, 24, 40, gen)[0])
    assert np.abs(first - second).max() > 0.1  # the generator advanced
    again = sampler.sample_homography_components(5000, 24, 40, 3, shift="continuous")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(again["matrix"]), first)
    with pytest.raises(ValueError, match="shift"):
        sampler.sample_homographies(2, 32, 32, 0, shift="pixels")


# -------------------------------------------------------------------------------- (d) JAX
@pytest.mark.slow
def test_jax_child_imports_no_tensorflow(jax_results):
    assert not bool(jax_results["tensorflow_imported"])


@pytest.mark.slow
def test_jax_warp_matches_tensorflow_backend(inputs, tf_results, jax_results):
    eager = np.abs(jax_results["warp_eager"] - tf_results["warp_eager"]).max()
    compiled = np.abs(jax_results["warp_jit"] - tf_results["warp_eager"]).max()
    interior, _ = _interior_errors(inputs["images"], inputs["t"], jax_results["warp_jit"], 0.5)
    print(f"\nwarping.warp JAX vs TF backend: max |diff| {eager:.1e} (eager), {compiled:.1e} "
          f"(jax.jit); jax.jit vs cv2 interior {interior:.1e}")
    assert eager < 1e-5 and compiled < 1e-5 and interior < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_warp_pairs_in_the_step_equal_the_host_pairs(backend, inputs, tf_results, jax_results):
    """`--warp=device`: the pair made inside the compiled step (`WarpPairs`, XLA on both
    backends) equals the tf.data pipeline's host warp (`homographies.warp`) of the same uint8
    crops and homographies, normalised alike."""
    from aetv2_tf.data.constants import AETV1_FILL
    from aetv2_tf.data.homographies import warp

    results = tf_results if backend == "tensorflow" else jax_results
    images = inputs["uint8_images"].astype(np.float32) / 255.0
    host = warp(images, inputs["t"][:len(images)], fill_value=AETV1_FILL).numpy()
    for name in ("pairs", "pairs_xla"):
        np.testing.assert_allclose(results[f"{name}_x"], (images - 0.5) / 0.25, atol=1e-5)
        err = np.abs(results[f"{name}_tx"] * 0.25 + 0.5 - host).max()
        print(f"\nWarpPairs ({backend}, {name}) vs the host warp: max |diff| {err:.1e}")
        assert err < 1e-4, name


@pytest.mark.slow
def test_jax_quarter_turns_exact(jax_results):
    np.testing.assert_array_equal(jax_results["rot90_eager"], 0.0)
    np.testing.assert_array_equal(jax_results["rot90_jit"], 0.0)
    assert jax_results["rot90_sampled_t_err"] == 0.0 and jax_results["rot90_sampled"] == 0.0


@pytest.mark.slow
def test_jax_sampler(jax_results):
    _check_sampler(jax_results, "JAX")


# ------------------------------------------------------------------------ (e) HomographyPairs
def _check_fit(results, label):
    print(f"\n{label} fit: loss {results['fit_loss'].tolist()}, running energy "
          f"{results['fit_energy'].tolist()}, replayed {results['replay_energy'].tolist()}, "
          f"seed state {results['fit_state0'].tolist()} -> {results['fit_state'].tolist()}")
    assert results["fit_loss"].shape == (2,) and np.all(np.isfinite(results["fit_loss"]))
    assert results["fit_weight_change"] > 0
    np.testing.assert_array_equal(results["fit_state0"], [checks.FIT_SEED, 0])
    np.testing.assert_array_equal(results["fit_state"], [checks.FIT_SEED, 2])  # once per step
    # The energy (mean params^2) is a running mean over the steps. A fresh layer with the same
    # seed replays both batches: the same seed gives the same first batch, and step 2 drew new
    # homographies.
    e1, running = results["fit_energy"]
    e2 = 2 * running - e1
    np.testing.assert_allclose([e1, e2], results["replay_energy"], rtol=1e-4)
    assert abs(e2 - e1) > 1e-3 * e1
    np.testing.assert_array_equal(results["restored_state"], [checks.FIT_SEED, 2])  # checkpointed


def test_pairs_in_model_fit_tensorflow(tf_results):
    _check_fit(tf_results, "TF")


@pytest.mark.slow
def test_pairs_in_model_fit_jax(jax_results):
    _check_fit(jax_results, "JAX")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_loss_reads_the_traced_step_counter(backend, tf_results, jax_results):
    """--mse_decay_steps on any backend: the jitted step's loss sees steps 0, 1, 2, 3 (weights
    1, 2/3, 1/3, 0), not a step frozen at compile time (which would log 1 throughout)."""
    results = tf_results if backend == "tensorflow" else jax_results
    means = np.cumsum([1.0, 2 / 3, 1 / 3, 0.0]) / np.arange(1, 5)  # Keras logs running means
    logged = results["loss_step_running_means"]
    assert len(logged) in (2, 4), logged  # one log per execution of 2 steps, or per step
    every = 4 // len(logged)
    np.testing.assert_allclose(logged, means[every - 1::every], atol=1e-6)
    assert int(results["loss_step_final"]) == 4


def test_pairs_outputs_match_the_pretext_protocol(inputs):
    """x is a 4-px zero-padded crop (+ flip) of the image, tx = warp(x, T, 128/255), normalised."""
    images = inputs["uint8_images"]
    layer = HomographyPairs(seed=9)
    x, tx, params = (keras.ops.convert_to_numpy(v) for v in layer(images))
    assert x.shape == tx.shape == (16, 32, 32, 3) and params.shape == (16, 8)
    mean, std = np.array(pipelines.CIFAR10_MEAN), np.array(pipelines.CIFAR10_STD)
    np.testing.assert_array_equal(CIFAR10_MEAN, pipelines.CIFAR10_MEAN)
    np.testing.assert_array_equal(CIFAR10_STD, pipelines.CIFAR10_STD)
    assert AETV1_FILL == homographies.AETV1_FILL
    raw = x * std + mean
    padded = np.pad(images / 255.0, [(0, 0), (4, 4), (4, 4), (0, 0)])
    found = {"flipped": 0, "shifted": 0}
    for b in range(len(images)):
        matches = [(oy, ox, f) for oy in range(9) for ox in range(9) for f in (False, True)
                   if np.abs(padded[b, oy:oy + 32, ox:ox + 32][:, ::-1 if f else 1]
                             - raw[b]).max() < 1e-5]
        assert matches, f"x[{b}] is no crop/flip of the zero-padded image"
        found["flipped"] += any(f for _, _, f in matches)
        found["shifted"] += any((oy, ox) != (4, 4) for oy, ox, _ in matches)
    assert found["flipped"] > 0 and found["shifted"] > 0
    t = np.concatenate([params, np.ones((16, 1), np.float32)], -1).reshape(16, 3, 3)
    expected = keras.ops.convert_to_numpy(warping.warp(raw.astype(np.float32), t,
                                                      homographies.AETV1_FILL))
    np.testing.assert_allclose(tx * std + mean, expected, atol=1e-5)
    plain = HomographyPairs(seed=9, augment=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(plain(images)[0]) * std + mean,
                               images / 255.0, atol=1e-6)


def test_pairs_serialization():
    layer = HomographyPairs(seed=4, shift="continuous", fill_value=0.5, name="p")
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(clone, HomographyPairs)
    assert clone.get_config() == layer.get_config()
    with pytest.raises(ValueError, match="shift"):
        HomographyPairs(shift="pixels")


def test_device_modules_import_without_tensorflow():
    code = ("import sys; sys.modules['tensorflow'] = None; "
            "import aetv2_tf.data.preprocessing_layers as d; import aetv2_tf.data as data; "
            "assert 'aetv2_tf.data.homographies' not in sys.modules; "
            "print(d.HomographyPairs.__name__)")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "HomographyPairs" in proc.stdout, proc.stderr[-2000:]


def test_lazy_data_package_keeps_public_names():
    assert data.pretext_dataset is pipelines.pretext_dataset
    assert data.warp is homographies.warp and data.load_cifar10 is load_cifar10
    assert set(data.__all__) <= set(dir(data))
    with pytest.raises(AttributeError):
        data.no_such_name  # noqa: B018
