"""Many steps per host call under Keras on JAX are the same training: after N steps of the pairs
model (pairs sampled and warped inside the step), ``fit`` with ``steps_per_execution`` 1, 2
and N, and N `train_step`s inside ONE jitted loop whose batches are sliced from a uint8 training
set resident on the device (the fastest feeding, `benchmarks.step_breakdown`'s
``step_resident``), give the same losses and weights. Run in a child process, TensorFlow
blocked, as on the device.

Measured: the three ``fit`` runs are bitwise equal (Keras on JAX runs ``steps_per_execution``
steps as that many calls of the same compiled step, from a Python loop: the host still feeds
and dispatches every step); the resident loop's weights and moving statistics are within 2e-6
of the largest trainable weight change of the ``fit`` run (another compiled program: XLA fuses
the loop's steps otherwise); tolerance 1e-4.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli import REPO, _env

pytestmark = pytest.mark.slow

CASE = """
import sys; sys.modules['tensorflow'] = None; sys.path.insert(0, 'tests')
import json, jax, jax.numpy as jnp, keras, numpy as np
import one_pass_case
N, B = 4, 4
images = np.random.default_rng(0).integers(0, 256, (N * B, 16, 16, 3), np.uint8)

def fresh():
    keras.utils.set_random_seed(0)
    return one_pass_case.build_model_on(one_pass_case.tiny_bn_encoder("keras"), None)

runs = {}
for spe in (1, 2, N):
    model = fresh()
    model.compile(optimizer=keras.optimizers.SGD(1e-3), steps_per_execution=spe)
    history = model.fit(images, batch_size=B, epochs=1, shuffle=False, verbose=0)
    runs[spe] = (history.history["loss"][-1], [np.asarray(v) for v in model.weights])
model = fresh()
model.compile(optimizer=keras.optimizers.SGD(1e-3))
model.train_on_batch(images[:B])  # builds the metrics; then back to the start (the sampler's
start = fresh()  # state too: a seed generator's state is a variable but not a weight)
for a, b in zip(model.trainable_variables + model.non_trainable_variables,
                start.trainable_variables + start.non_trainable_variables):
    a.assign(b.value)
start = [np.asarray(v) for v in start.trainable_variables]
state = tuple([v.value for v in vs] for vs in (model.trainable_variables,
    model.non_trainable_variables, model.optimizer.variables, model.metrics_variables))
data = jnp.asarray(images)
step = lambda i, s: model.train_step(s, (jax.lax.dynamic_slice_in_dim(data, i * B, B), None,
                                          None))[1]
state = jax.jit(lambda s: jax.lax.fori_loop(0, N, step, s))(state)
for v, value in zip(model.trainable_variables, state[0]):
    v.assign(value)
for v, value in zip(model.non_trainable_variables, state[1]):
    v.assign(value)
loop = [np.asarray(v) for v in model.weights]
change = max(float(np.max(np.abs(a - b))) for a, b in
             zip([np.asarray(v) for v in model.trainable_variables], start))
floats = [i for i, v in enumerate(model.weights) if "float" in str(v.dtype)]
print("RESULT", json.dumps(dict(
    losses=[runs[s][0] for s in runs],
    fit_equal=all(np.array_equal(a, b) for s in (2, N) for a, b in zip(runs[1][1], runs[s][1])),
    loop=max(float(np.max(np.abs(loop[i] - runs[1][1][i]))) for i in floats) / change,
    change=change)))
"""


def test_steps_per_execution_and_a_resident_loop_train_the_same():
    proc = subprocess.run([sys.executable, "-c", CASE], cwd=REPO, capture_output=True, text=True,
                          env=_env({"KERAS_BACKEND": "jax"}), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")][-1]
    got = json.loads(line.split(" ", 1)[1])
    print(f"[info] {got}")
    assert got["fit_equal"] and len(set(got["losses"])) == 1
    assert got["change"] > 1e-4 and got["loop"] <= 1e-4
