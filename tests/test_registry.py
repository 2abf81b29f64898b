"""`import aetv2_tf` is all `keras.saving.load_model` needs (issue 32, aetv2_tf/registry.py): in a
fresh process, whatever the module of the package imported first and in either order with
Keras, the `.keras` files the library writes reload (the CLI's: tests/test_train_cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import aetv2_tf

# The fast tier (`-m "not slow"`) leaves this file out: a fresh Python process per case.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A compiled pairs model (its optimizer, loss, metrics, sampler) and a classifier, with
    Keras BatchNorm (the fused kernel is TensorFlow's)."""
    directory = tmp_path_factory.mktemp("registry")
    encoder = aetv2_tf.build_backbone("nin", (16, 16, 3), batch_norm="keras")  # any backend
    model = aetv2_tf.AETV1.build_model(encoder, seed=0)
    aetv2_tf.AETV1.compile(model, steps=100)
    model.save(directory / "pairs.keras")
    aetv2_tf.build_classifier(encoder, 10, feature="block2").save(directory / "classifier.keras")
    return directory


IMPORTS = {
    "package, then keras": "import aetv2_tf, keras",
    "keras, then package": "import keras, aetv2_tf",
    "a library module first": "from aetv2_tf.files.saving import load_encoder; import keras",
    "a registered module first": "import aetv2_tf.method.losses, keras",
}


@pytest.mark.parametrize(("backend", "imports"), [
    *(("tensorflow", name) for name in IMPORTS), ("jax", "package, then keras")])
def test_a_fresh_process_reloads_the_library_files(saved, backend, imports):
    script = textwrap.dedent(f"""
        import sys
        if {backend!r} == "jax":
            sys.modules["tensorflow"] = None  # the JAX path needs no TensorFlow
        {IMPORTS[imports]}
        import numpy as np
        pairs = keras.saving.load_model({str(saved / "pairs.keras")!r})
        classifier = keras.saving.load_model({str(saved / "classifier.keras")!r})
        images = np.zeros((2, 16, 16, 3), np.uint8)
        print(type(pairs.loss).__name__, type(pairs.optimizer).__name__,
              classifier.predict(images, verbose=0).shape)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd="/", timeout=300, env={**os.environ, "KERAS_BACKEND": backend})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[:2] == ["ParameterMSELoss", "SkipNonFinite"], proc.stdout
    assert proc.stdout.strip().endswith("(2, 10)")
