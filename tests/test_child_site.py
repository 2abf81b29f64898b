"""The suite's child processes run with tests/child_site/sitecustomize.py (conftest.py puts it on
PYTHONPATH): the test extras that Keras and TensorFlow would import at start-up are hidden there,
and only there; their temporary files go to the session's cache folder."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

CHILD_SITE = str(pathlib.Path(__file__).resolve().parent / "child_site")  # as conftest.py has it

PROBE = ("import sys; print([m for m in ('sklearn', 'cv2', 'jax') if m in sys.modules and "
         "sys.modules[m] is None])")


def child(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=60, check=True)


def test_children_hide_the_oracles_and_jax_only_under_tensorflow():
    assert CHILD_SITE in os.environ["PYTHONPATH"].split(os.pathsep)
    assert child(PROBE, KERAS_BACKEND="tensorflow").stdout.strip() == "['sklearn', 'cv2', 'jax']"
    assert child(PROBE, KERAS_BACKEND="jax").stdout.strip() == "['sklearn', 'cv2']"
    refused = subprocess.run([sys.executable, "-c", "import sklearn"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 1 and "ModuleNotFoundError" in refused.stderr


def test_this_process_keeps_the_oracles():
    import cv2  # the warp's oracle (tests/test_device_warp.py)
    from sklearn.neighbors import KNeighborsClassifier  # the KNN oracle (tests/test_knn.py)

    assert KNeighborsClassifier is not None and cv2.warpPerspective is not None


def test_a_sitecustomize_further_down_the_path_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('the distribution site ran')\n")
    out = child(PROBE, KERAS_BACKEND="tensorflow",
                PYTHONPATH=os.pathsep.join([CHILD_SITE, str(tmp_path)])).stdout
    assert out.splitlines() == ["the distribution site ran", "['sklearn', 'cv2', 'jax']"]


def test_children_write_temporary_files_in_the_session_folder():
    """What a killed child leaves in its temporary folder goes with the session's cache folder
    (conftest.py made it, and removes it at the end; a folder given in $AETV2_CACHE_DIR is not
    used for this)."""
    cache = os.environ["AETV2_CACHE_DIR"]
    made = os.path.basename(cache).startswith("aetv2-test-cache-")  # conftest.py's mkdtemp
    out = child("import tempfile; print(tempfile.gettempdir())").stdout.strip()
    assert (out == os.path.join(cache, "tmp")) == made, (out, cache)
