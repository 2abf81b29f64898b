"""The prepared GPU measurement (`benchmarks.device_step`, BENCHMARKS.md "GPU step: the prepared
measurement") at tiny size on the CPU, as the device runs it: Keras on JAX with TensorFlow
blocked in every process; all three parts report (the PyTorch peer says "torch not installed"
where PyTorch is missing, as in this project's environment)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.cli import run_module

pytestmark = pytest.mark.slow

PIECES = ("pairs", "encoder_two_pass", "encoder_one_pass", "loss_svd", "loss_newton",
          "optimizer", "step_in_loop", "step_resident", "step_dispatched")


def test_device_step_at_tiny_size(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = {"KERAS_BACKEND": "jax", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        # XLA's cheaper CPU compilation: the same programs, compiled in half the time.
        "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"}
    out = tmp_path / "out"
    proc = run_module("benchmarks.device_step", "--tiny", f"--output={out}", env=env,
                      timeout=900)
    results = json.loads((out / "device_step.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["console.txt", "device_step.json"]

    keras = results["keras"]
    assert keras["exit"] == 0 and keras["backend"] == "jax" and keras["batch"] == 8
    rows = keras["variants"]
    assert [rows[n]["batch_groups"] for n in rows] == [1, 2, 2]
    assert [rows[n]["projection"] for n in rows] == ["svd", "svd", "newton"]
    for row in rows.values():
        assert row["pairs_per_s"] > 0 and row["first_execution_s"] > 0
        numbers = row["numerics"]
        # bfloat16: one call or two move the loss and the gradients no more than bfloat16
        # itself does against the float32 step (about 3e-2 of the largest gradient here)
        assert numbers["loss_vs_two_pass"] <= 1e-2 * numbers["loss"]
        assert numbers["grad_vs_two_pass"] <= 0.1 and numbers["grad_vs_float32"] <= 0.1

    breakdown = results["breakdown"]
    assert breakdown["exit"] == 0, breakdown
    for piece in PIECES:
        assert breakdown[piece]["ms"] > 0, piece
    assert breakdown["resident_bytes"] == 64 * 32 * 32 * 3

    torch = results["torch"]
    assert torch["exit"] == 0
    if importlib.util.find_spec("torch") is None:
        assert torch == {"torch": "torch not installed", "exit": 0,
                         "wall_s": torch["wall_s"]}
        assert "torch: torch not installed" in proc.stdout
    else:
        assert all(row["pairs_per_s"] > 0 for row in torch["variants"].values())

    console = (out / "console.txt").read_text()
    assert "== summary" in console and "| keras one_pass_newton |" in console
    assert console.count("== ") == 4  # the three parts and the summary
