"""The loss screen's tools (experiments/loss_screen/) at tiny size: the gradient table of the
losses, the linear read-out of what an encoder holds of the transformation, and the GPU screen's
script on the CPU (Keras on JAX), whose encoder the read-out then reads beside a random init."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from tests.cli import REPO, run_module


@pytest.mark.slow
def test_loss_gradients_module():
    """The gradient table of the losses: the angle in the 16x frame alone puts no gradient on
    perspective, AETv1 and the default AETv2 (its unit-frame residual) a fifth or more."""
    proc = run_module("experiments.loss_screen.loss_gradients", "--pairs=256", "--lambdas=10",
                      "--mse_weights=0.3", timeout=300)
    rows = {r.split("|")[1].strip(): [float(v) for v in r.split("|")[2:-1]]
            for r in proc.stdout.splitlines() if r.startswith("| A") or r.startswith("| H")}
    assert rows["AETV2_ZOOM16"][2] < 0.01 and rows["AETV1 (normalised MSE)"][2] > 0.2, rows
    assert rows["AETV2 (default)"][2] > 0.2, rows
    assert rows["AETV2 (default)"] == rows["AETV2 lambda=10"], rows
    assert all(abs(sum(r[:3]) - 1.0) <= 2e-3 for r in rows.values()), rows


def test_readout_helpers_recover_a_linear_map():
    from experiments.loss_screen.readout import r2, read_out, ridge, targets

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8))
    y = x @ rng.normal(size=(8, 2)) + 3.0
    assert r2(y[300:], ridge(x[:300], y[:300], x[300:], alpha=1e-6)) > 0.999
    params = np.tile([1.2, 0.0, 0.1, 0.0, 1.2, -0.2, 0.01, 0.0], (4, 1))
    got = targets(params)
    np.testing.assert_allclose(got["scale"][:, 0], 1.2)
    np.testing.assert_allclose(got["translation"][0], [0.1, -0.2])
    k = rng.integers(0, 4, 400)
    feats = np.concatenate([np.eye(4)[k], x], 1)  # the turn and the parameters, linearly
    out = read_out(feats, x, k, 0.75, alpha=1e-3)
    assert out["quarter turn accuracy"] == 1.0, out
    assert out["translation R^2"] > 0.999 and out["keystone R^2"] > 0.999, out


@pytest.fixture(scope="module")
def screened(tmp_path_factory, cifar10_dir) -> dict:
    """experiments/loss_screen/gpu_screen.sh on the CPU (Keras on JAX, 2 steps of 8 pairs, two
    methods, two seeds, DEADLINE_S=1), then the read-out of its one encoder and of a random init
    (96 pairs each, one process)."""
    tmp = tmp_path_factory.mktemp("loss_screen")
    out, runs = tmp / "out", tmp / "runs"
    env = dict(os.environ, OUT=str(out), RUNS=str(runs), WHL="none", PY=sys.executable,
               DATA=str(cifar10_dir), EXTRA="--train_examples=64", STEPS="2", SPE="1",
               SUMMARY="1", WARMUP="1", BATCH="8", METHODS="hybrid sq4_unitres",
               SEEDS="0 2", DEADLINE_S="1")
    script = subprocess.run(["bash", "experiments/loss_screen/gpu_screen.sh"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert script.returncode == 0, script.stdout[-3000:] + script.stderr[-3000:]
    readout = run_module("experiments.loss_screen.readout", str(runs / "hybrid_s0"), "none",
                         "--pairs=96", f"--data_dir={cifar10_dir}", "--json", timeout=300)
    return dict(out=out, runs=runs, script=script, readout=readout)


@pytest.mark.slow
def test_the_gpu_screen_trains_the_first_run_and_skips_the_rest_past_its_deadline(screened):
    """The first run trains and comes back as <method>.tar; with DEADLINE_S=1 every later run is
    skipped, in the interleaved order (seed 0 of each method, then seed 2)."""
    out, runs, proc = screened["out"], screened["runs"], screened["script"]
    events = [line.split()[1:3] for line in proc.stdout.splitlines() if line.startswith("== ")
              and line.split()[1].endswith(("_s0", "_s2"))]
    assert events[:2] == [["hybrid_s0", "at"], ["hybrid_s0", "exit"]], proc.stdout
    assert events[2:] == [[n, "SKIPPED:"] for n in ("sq4_unitres_s0", "hybrid_s2",
                                                    "sq4_unitres_s2")], proc.stdout
    assert "hybrid_s0 exit 0" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["console.txt", "hybrid.tar"]
    with tarfile.open(out / "hybrid.tar") as tar:
        assert sorted(tar.getnames()) == [f"hybrid_s0/{f}" for f in (
            "encoder.weights.h5", "flags.cfg", "flags.json", "train/log.csv")]
    flags = json.loads((runs / "hybrid_s0" / "flags.json").read_text())
    assert (flags["backend"], flags["mse_weight"], flags["angle_power"], flags["seed"],
            flags["loss_frame_scale"], flags["warmup_steps"]) == ("jax", 0.3, 2, 0, 4.0, 1)


@pytest.mark.slow
def test_the_readout_reads_a_screened_encoder_and_a_random_init(screened):
    proc, run = screened["readout"], screened["runs"] / "hybrid_s0"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["encoder"] for r in rows] == [str(run), "none"], proc.stdout
    assert all(r["pairs"] == 96 and 0.0 <= r["quarter turn accuracy"] <= 1.0 for r in rows)
    assert f"| {run} | " in proc.stdout and "| none | " in proc.stdout
    assert proc.stdout.count("| 72 / 24 |") == 2
