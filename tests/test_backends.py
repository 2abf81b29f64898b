"""The mathematics on Keras 3's JAX backend: same values and gradients as under TensorFlow.

A child process with ``KERAS_BACKEND=jax`` and TensorFlow blocked (``sys.modules['tensorflow'] =
None``: any TensorFlow import fails) evaluates, in float32, values and ``jax.grad`` gradients of
`project_to_so3`, `rotation_angle`, `aetv2_distance` and `GeodesicLoss` (the paper's form and
each knob of `tests.numerics.VARIANTS`) at random near-identity inputs, the identity, the
exact quarter turns, a 180-degree turn (theta = pi) and a non-finite sample
(tests/backend_cases.py); this process computes the same with TensorFlow. Run with ``-s`` to see
the measured cross-backend errors (``[max-err]`` lines).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from tests import backend_cases
from tests.cli import REPO
from tests.numerics import (
    IDENTITY,
    QUARTER_TURNS,
    R180,
    VARIANTS,
    check_close,
    np_variant_loss,
    random_params,
)

# The fast tier (`-m "not slow"`) leaves this file out: every test reads the Keras-on-JAX
# child's results.
pytestmark = pytest.mark.slow

ALL_VARIANTS = {"paper": {}, **VARIANTS}

CHILD = """
import json, sys
sys.modules["tensorflow"] = None  # any TensorFlow import now fails
sys.path.insert(0, sys.argv[1])
import keras
assert keras.backend.backend() == "jax", keras.backend.backend()
import aetv2_tf.method.geometry, aetv2_tf.method.losses, aetv2_tf.method.metrics  # noqa: F401
from tests import backend_cases
result = backend_cases.run(json.load(sys.stdin), "jax")
print("@@JSON@@" + json.dumps(result))
"""


def params(m):
    m = np.asarray(m, np.float64)
    return (m / m[..., 2:, 2:]).reshape(*m.shape[:-2], 9)[..., :8]


def make_spec():
    rng = np.random.default_rng(20200614)
    near = np.eye(3) + 0.1 * rng.normal(size=(6, 3, 3))
    half_turn_x = Rotation.from_rotvec([np.pi, 0.0, 0.0]).as_matrix()
    matrices = np.stack([*near, np.eye(3), *QUARTER_TURNS[1:], half_turn_x])
    rotations = np.stack([*Rotation.random(4, random_state=7).as_matrix(), *QUARTER_TURNS,
                          np.diag([1.0, -1.0, -1.0]),  # pi about x, exactly symmetric
                          Rotation.from_rotvec([0.0, np.radians(179.0), 0.0]).as_matrix()])
    t = np.stack([*(np.eye(3) + 0.1 * rng.normal(size=(4, 3, 3))), np.eye(3), *QUARTER_TURNS])
    t_hat = np.stack([*(np.eye(3) + 0.1 * rng.normal(size=(4, 3, 3))), np.eye(3),
                      *([np.eye(3)] * 4)])
    y_true = np.stack([*random_params(4, 1, 0.1), IDENTITY, *params(QUARTER_TURNS[1:]), IDENTITY])
    y_pred = np.stack([*random_params(4, 2, 0.1), *([IDENTITY] * 5)])
    y_pred[-1, 2] = np.nan  # a non-finite sample: loss 0 and gradient 0
    assert np.array_equal(y_true[6], R180)  # row 6: theta = pi exactly
    return {"matrices": matrices, "weights": rng.normal(size=matrices.shape),
            "rotations": rotations, "t": t, "t_hat": t_hat, "y_true": y_true, "y_pred": y_pred,
            "fd_true": random_params(4, 3, 0.1), "fd_pred": random_params(4, 4, 0.1),
            "compiled": ["paper", "all"],
            "variants": {k: {n: (v.tolist() if isinstance(v, np.ndarray) else v)
                             for n, v in kw.items()} for k, kw in ALL_VARIANTS.items()}}


def to_json(spec):
    as_is = ("variants", "compiled")
    return json.dumps({k: v if k in as_is else np.asarray(v, np.float32).tolist()
                       for k, v in spec.items()})


@pytest.fixture(scope="module")
def spec():
    return make_spec()


@pytest.fixture(scope="module")
def jax_child(spec, tmp_path_factory):
    """The JAX child, started on `spec`; `jax_result` reads its answer. Started by `tf_result`
    too, so that the two backends' evaluations overlap."""
    spec_file = tmp_path_factory.mktemp("backends") / "spec.json"
    spec_file.write_text(to_json(spec))
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    with open(spec_file) as stdin:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(REPO)], stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, cwd=REPO)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def jax_result(jax_child):
    stdout, stderr = jax_child.communicate(timeout=600)
    assert jax_child.returncode == 0, stderr[-4000:]
    line = [x for x in stdout.splitlines() if x.startswith("@@JSON@@")][-1]
    return json.loads(line[len("@@JSON@@"):])


@pytest.fixture(scope="module")
def tf_result(spec, jax_child):
    return json.loads(json.dumps(backend_cases.run(json.loads(to_json(spec)), "tensorflow")))


def test_jax_child_never_imports_tensorflow(jax_result):
    env = jax_result["environment"]
    assert env == {"backend": "jax", "tensorflow_blocked": True, "tensorflow_loaded": False}


def compare(name, jax_values, tf_values, rtol):
    """|JAX - TF| <= rtol * max(1, max |TF|) (float32 rounding of two SVD implementations)."""
    a, b = np.asarray(jax_values, np.float64), np.asarray(tf_values, np.float64)
    assert a.shape == b.shape, (name, a.shape, b.shape)
    assert np.array_equal(np.isfinite(a), np.isfinite(b)), name
    return check_close(f"JAX vs TF {name}", np.nan_to_num(a), np.nan_to_num(b),
                       rtol * max(1.0, float(np.max(np.abs(np.nan_to_num(b))))))


# Relative tolerance (of the largest |TF| entry) of the cross-backend comparison: float32 rounding
# of two different SVDs (TF's and LAPACK's via JAX). Measured worst case 1.2e-5, on one random
# near-identity pair (every loss form), where JAX and TF are 6e-6 and 4e-6 away from float64
# finite differences, in opposite directions. The pixel frame is the exception: at its
# theta = pi row (R180 vs I, |gradient| up to ~1.8e3) M = F R180 F^{-1} is badly conditioned and
# BOTH backends' float32 gradients differ from float64 finite differences of the oracle by ~2e-4
# relative (measured: JAX 0.31, TF 0.36), so there the backends can only agree to that accuracy
# (measured 3.7e-4 relative).
RTOL = {"loss/pixel_frame grad": 1e-3}


@pytest.mark.parametrize("name", ["project_to_so3", "rotation_angle", "aetv2_distance",
                                  *(f"loss/{k}" for k in ALL_VARIANTS),
                                  "compiled/paper", "compiled/all"])
def test_values_and_gradients_match_tensorflow(jax_result, tf_result, name):
    for part in ("value", "grad", "p"):
        if part in tf_result[name]:
            compare(f"{name} {part}", jax_result[name][part], tf_result[name][part],
                    RTOL.get(f"{name} {part}", 3e-5))


@pytest.mark.parametrize("name", ["paper", "all"])
def test_compiled_matches_eager_on_each_backend(jax_result, tf_result, name):
    """``jax.jit`` and TF's XLA (``jit_compile=True``) against the eager values and gradients
    (XLA's SVD is another implementation again: the cross-backend tolerance; measured worst
    5.9e-6, TF's paper-form gradient)."""
    for backend, result in (("JAX", jax_result), ("TF", tf_result)):
        for part in ("value", "grad"):
            eager = np.asarray(result[f"loss/{name}"][part])
            check_close(f"{backend} compiled vs eager {name} {part}",
                        result[f"compiled/{name}"][part], eager,
                        3e-5 * max(1.0, float(np.max(np.abs(eager)))))


def test_nonfinite_sample_and_the_cut_locus_on_jax(jax_result, tf_result):
    """The last row has a NaN: loss 0, gradient 0, flagged. Row 6 is theta = pi (R180 vs I):
    the paper's form has no gradient there, the chordal and MSE knobs do (as under TF)."""
    assert jax_result["nonfinite_samples"] == tf_result["nonfinite_samples"]
    assert jax_result["nonfinite_samples"][-1] == 1.0
    assert sum(jax_result["nonfinite_samples"]) == 1.0
    for name in ALL_VARIANTS:
        value, grad = (np.asarray(jax_result[f"loss/{name}"][k]) for k in ("value", "grad"))
        assert value[-1] == 0.0 and np.all(grad[-1] == 0.0), name
        assert np.all(np.isfinite(value)) and np.all(np.isfinite(grad)), name
    for result in (jax_result, tf_result):
        loss = result["loss/paper"]
        assert loss["value"][6] == pytest.approx(np.pi, abs=1e-6)
        assert np.all(np.asarray(loss["grad"][6]) == 0.0)
        assert np.all(np.asarray(loss["grad"][4]) == 0.0)  # the identity pair: the minimum
        for name in ("chordal", "mse", "all"):
            assert np.linalg.norm(result[f"loss/{name}"]["grad"][6]) > 0.1, name


@pytest.mark.parametrize("name", sorted(ALL_VARIANTS))
def test_jax_polar_gradient_matches_finite_differences(spec, jax_result, name):
    """The JAX gradient of the summed loss against float64 central differences of the oracle."""
    kwargs = ALL_VARIANTS[name]
    y_true, y_pred = (np.asarray(spec[k], np.float32).astype(np.float64)
                      for k in ("fd_true", "fd_pred"))
    h, numeric = 1e-6, np.zeros_like(y_pred)
    for i in np.ndindex(y_pred.shape):
        e = np.zeros_like(y_pred)
        e[i] = h
        numeric[i] = (np.sum(np_variant_loss(y_true, y_pred + e, **kwargs))
                      - np.sum(np_variant_loss(y_true, y_pred - e, **kwargs))) / (2 * h)
    check_close(f"JAX {name} gradient vs FD float64", jax_result[f"fd/{name}"]["grad"], numeric,
                2e-3 * max(1.0, np.max(np.abs(numeric))))
    value = np_variant_loss(y_true, y_pred, **kwargs)
    check_close(f"JAX {name} value vs float64", jax_result[f"fd/{name}"]["value"], value,
                2e-5 * max(1.0, np.max(value)))
