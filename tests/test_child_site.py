"""The suite's child processes run with tests/child_site/sitecustomize.py (conftest.py puts it on
PYTHONPATH): the test extras that Keras and TensorFlow would import at start-up are hidden there,
and only there."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import CHILD_SITE

PROBE = ("import sys; print([m for m in ('sklearn', 'jax') if m in sys.modules and "
         "sys.modules[m] is None])")


def child(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=60, check=True)


def test_children_hide_the_oracles_and_jax_only_under_tensorflow():
    assert CHILD_SITE in os.environ["PYTHONPATH"].split(os.pathsep)
    assert child(PROBE, KERAS_BACKEND="tensorflow").stdout.strip() == "['sklearn', 'jax']"
    assert child(PROBE, KERAS_BACKEND="jax").stdout.strip() == "['sklearn']"
    refused = subprocess.run([sys.executable, "-c", "import sklearn"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "ModuleNotFoundError" in refused.stderr


def test_this_process_keeps_the_oracles():
    from sklearn.neighbors import KNeighborsClassifier  # the KNN oracle (tests/test_knn.py)

    assert KNeighborsClassifier is not None and sys.modules["sklearn"] is not None


def test_a_sitecustomize_further_down_the_path_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('the distribution site ran')\n")
    out = child(PROBE, KERAS_BACKEND="tensorflow",
                PYTHONPATH=os.pathsep.join([CHILD_SITE, str(tmp_path)])).stdout
    assert out.splitlines() == ["the distribution site ran", "['sklearn', 'jax']"]
