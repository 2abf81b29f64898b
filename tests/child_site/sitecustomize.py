"""The suite's child processes see what a user's install has: the package's runtime dependencies.

`tests/conftest.py` puts this folder first on PYTHONPATH, so every process the tests start
(`python -m aetv2_tf.train ...`, the benchmarks' children) runs this at start-up. It hides the
test extras that the programs never import (`sys.modules[name] = None`: their import raises
ImportError, as on a machine without them), because Keras and TensorFlow import them at start-up
when they are installed:

- scikit-learn (the KNN oracle of tests/test_knn.py): Keras's sklearn wrappers, 0.6 CPU-s;
- OpenCV (the warp's oracle): Keras's `draw_bounding_boxes` module, 0.02-0.07 CPU-s;
- JAX, where TensorFlow is the backend (KERAS_BACKEND=jax children keep it): TensorFlow Lite's
  `from jax import jit`, 0.4 CPU-s.

A tiny CLI training run costs ~10 CPU-s instead of ~12, in each of the suite's ~190 children.
The test processes themselves (pytest and its xdist workers) take the hiding back in conftest.py.
A `sitecustomize` further down the path (a distribution's own) still runs, after this one.
"""

import importlib.machinery
import importlib.util
import os
import sys

HIDDEN = ("sklearn", "cv2") + (("jax",) if os.environ.get("KERAS_BACKEND") == "tensorflow" else ())
for _name in HIDDEN:
    sys.modules.setdefault(_name, None)

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
