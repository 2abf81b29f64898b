"""Helpers of the end-to-end tests: run the programs in a subprocess from the repository root."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
# Small real-CIFAR-10 slices: every probe run takes seconds.
SLICE = ("--train_examples=600", "--test_examples=200", "--verbose=0")


def run_cli(*args: str, module: str = "aetv2_tf.train") -> subprocess.CompletedProcess:
    """``python -m module args`` from the repository root, quiet TensorFlow logs, 5 min max."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def run_ok(*args: str, module: str = "aetv2_tf.train") -> subprocess.CompletedProcess:
    """`run_cli`, asserting exit status 0 (the failure shows the end of stdout and stderr)."""
    proc = run_cli(*args, module=module)
    assert proc.returncode == 0, (f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n"
                                  f"{proc.stderr[-3000:]}")
    return proc
