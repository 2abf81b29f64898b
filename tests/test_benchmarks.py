"""Smoke tests of `benchmarks/`: each module runs with tiny arguments and prints its table; the
repository's BENCHMARKS.md is never touched (`--no_record`, or `--output` in a temporary dir).
Plus the pure helpers: FLOP count, config parsing, tables, the program-summary parser."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import pytest

from benchmarks import common
from benchmarks.budget import done_summary
from benchmarks.step_runner import Spec
from tests.cli import run_module


@pytest.fixture
def benchmarks_md_untouched():
    """Fails the test if BENCHMARKS.md at the repository root changed during it."""
    def digest():
        path = common.BENCHMARKS_MD
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None

    before = digest()
    yield
    assert digest() == before, "a benchmark smoke test modified BENCHMARKS.md"


def test_nin_step_is_3_gflop_per_pair():
    from aetv2_tf.models import build_aet_model, build_nin

    encoder = build_nin()
    model = build_aet_model(encoder)
    encoder_macs = common.forward_macs(encoder)
    per_pair = common.train_step_flops(2 * encoder_macs + common.forward_macs(model)
                                       - encoder_macs)
    # 0.25 GMAC per 32x32 image (the 5x5 conv of block 2 is half of it); 2 images a pair.
    assert encoder_macs == pytest.approx(250.7e6, rel=0.01)
    assert per_pair == pytest.approx(3.0e9, rel=0.01)


def test_spec_parsing():
    spec = Spec.parse("keras/bf16/mse/spe4/xla")
    assert (spec.batch_norm, spec.precision, spec.loss) == ("keras", "mixed_bfloat16", "mse")
    assert (spec.steps_per_execution, spec.xla) == (4, True)
    assert Spec.parse("fused/fp32/geodesic", 2).steps_per_execution == 2
    assert Spec.parse("fused/auto/geodesic").precision in ("float32", "mixed_bfloat16")
    jax = Spec.parse("jax:keras/auto/geodesic/spe3")
    assert (jax.backend, jax.precision, jax.steps_per_execution) == ("jax", "auto", 3)
    assert Spec.parse("tensorflow:fused/fp32/mse").backend == "tensorflow"
    assert jax.round_steps(4) == 6
    torch = Spec.parse("torch:torch/bf16/mse")
    assert (torch.backend, torch.batch_norm, torch.precision) == ("torch", "torch",
                                                                  "mixed_bfloat16")
    eigen = Spec.parse("fused/fp32/mse/spe2/eigen")
    assert (eigen.onednn, eigen.worker, eigen.steps_per_execution) == (False, "tensorflow-eigen", 2)
    assert (Spec.parse("fused/fp32/mse").worker, jax.worker) == ("tensorflow", "jax")
    joint = Spec.parse("jax:keras/fp32/mse/joint/spe2")
    assert (joint.siamese_batch_norm, joint.steps_per_execution) == ("joint", 2)
    assert Spec.parse("keras/fp32/mse").siamese_batch_norm == "per_branch"
    for bad in ("fused/fp32", "fused/fp16/geodesic", "other/fp32/mse", "fused/fp32/mse/spe0",
                "jax:fused/fp32/mse", "torch:keras/fp32/mse", "torch:torch/fp32/geodesic",
                "torch:torch/auto/mse", "keras:torch/fp32/mse", "torch/fp32/mse",
                "jax:keras/fp32/mse/eigen", "torch:torch/fp32/mse/eigen",
                "torch:torch/fp32/mse/joint"):
        with pytest.raises(ValueError, match="bad config"):
            Spec.parse(bad)


def test_the_pytorch_worker_says_how_to_install_pytorch(monkeypatch):
    """PyTorch is not a dependency: a torch: configuration without it stops with the fix."""

    from benchmarks.torch_peer import import_torch

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(SystemExit, match=r"pip install torch==2\.13\.0"):
        import_torch()


def test_tee_copies_each_line_as_it_comes(tmp_path):
    """A child's lines reach the sinks while it still runs (a killed command keeps them)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('first', flush=True); "
                              "sys.stdin.read(); print('last')"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    seen, path = [], tmp_path / "console.txt"
    with open(path, "w") as console:
        thread = common.tee(child.stdout, seen.append, common.line_writer(console, prefix="[c] "))
        for _ in range(600):  # until the first line is in, the child waiting for its input
            if seen:
                break
            time.sleep(0.05)
        assert seen == ["first\n"] and child.poll() is None
        assert path.read_text() == "[c] first\n"
        child.stdin.close()
        child.wait(60)
        thread.join(60)
    assert seen == ["first\n", "last\n"] and path.read_text() == "[c] first\n[c] last\n"


def test_helpers():
    assert common.markdown_table(["a", "b"], [[1, "x"]]) == "| a | b |\n|---|---|\n| 1 | x |"
    calls = []
    timings = common.interleave({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                repeats=2)
    assert calls == ["a", "b", "b", "a"] and all(len(t) == 2 for t in timings.values())
    line = "Done (pretext): steps=3, wall_time_s=1.5, loss=2.5. Outputs in runs/x.y"
    assert done_summary("noise\n" + line) == dict(steps="3", wall_time_s="1.5", loss="2.5")


@pytest.mark.slow
def test_step_module(tmp_path, benchmarks_md_untouched):
    """Both backends, and TensorFlow with oneDNN off, in one run: the JAX and the `/eigen`
    configurations are timed by worker processes of their kind; the joint Siamese BatchNorm
    (`/joint`) side by side with the per-branch steps."""
    output = tmp_path / "bench.md"
    proc = run_module("benchmarks.step", "--batch_size=4", "--steps=1", "--repeats=2",
                      "--warmup=1", "--matmul_n=64", "--intra_op=2", "--inter_op=2",
                      "--configs=fused/fp32/geodesic,jax:keras/auto/mse,fused/fp32/mse/eigen,"
                      "keras/fp32/mse/joint", f"--output={output}", timeout=300)
    assert "| fused/fp32/geodesic | tensorflow |" in proc.stdout
    joint = next(r for r in proc.stdout.splitlines() if r.startswith("| keras/fp32/mse/joint |"))
    assert float(joint.split("|")[3]) > 0 and float(joint.split("|")[-2].split("x")[0]) > 0
    assert "(tensorflow-eigen worker, float32, oneDNN=off)" in proc.stdout
    assert "| fused/fp32/mse/eigen | tensorflow |" in proc.stdout
    assert "matmul 64^3 bfloat16" in proc.stdout
    assert "built and warmed up jax:keras/auto/mse in" in proc.stdout
    assert "(jax worker, float32)" in proc.stdout  # auto on a CPU under JAX
    row = next(r for r in proc.stdout.splitlines() if r.startswith("| jax:keras/auto/mse |"))
    assert row.split("|")[2].strip() == "jax" and float(row.split("|")[3]) > 0
    text = output.read_text()
    assert text.startswith("# Benchmarks") and "## Training step (benchmarks.step)" in text
    assert "avx512_bf16" in text and "python -m benchmarks.step --batch_size=4" in text
    assert "(oneDNN on)" in text  # this process: aetv2_tf asks for oneDNN
    assert "TensorFlow kernels: oneDNN on in this process" in text


@pytest.mark.slow
def test_pipeline_module(cifar10_dir, benchmarks_md_untouched):
    proc = run_module("benchmarks.pipeline", f"--data_dir={cifar10_dir}", "--batch_size=8",
                      "--batches=2", "--repeats=1", "--step_rate=50", "--train_examples=256",
                      "--no_record", timeout=300)
    assert "| pipeline, 1 core |" in proc.stdout and "| pipeline, all cores |" in proc.stdout
    assert "Appended" not in proc.stdout


@pytest.mark.slow
def test_warp_module(cifar10_dir, benchmarks_md_untouched):
    proc = run_module("benchmarks.warp", f"--data_dir={cifar10_dir}", "--batch_size=8",
                      "--batches=2", "--repeats=1", "--no_record", timeout=300)
    rows = [r for r in proc.stdout.splitlines() if r.startswith("| fused warp, 1 core |")
            or r.startswith("| device warp, all cores |")]
    assert len(rows) == 2 and rows[0].split("|")[4].strip() == "1.00x", proc.stdout
    assert float(rows[1].split("|")[2]) > 0 and "Appended" not in proc.stdout


@pytest.mark.slow
def test_budget_module(tmp_path, cifar10_dir, benchmarks_md_untouched):
    proc = run_module("benchmarks.budget", "--steps=1", "--batch_size=8", "--methods=AETv2,random",
                      f"--work_dir={tmp_path}", f"--data_dir={cifar10_dir}",
                      "--knn_train_examples=100", "--knn_test_examples=50", "--no_record",
                      timeout=600)
    assert "| AETv2 | 1 | 8 |" in proc.stdout and "| random | 0 | 0 |" in proc.stdout
    results = json.loads((tmp_path / "aetv2_knn" / "results.json").read_text())
    assert results["test_examples"] == 50 and results["train_examples"] == 100


@pytest.mark.slow
def test_keras_step_module_times_alexnet_and_a_probe(benchmarks_md_untouched):
    """The training program's AlexNet 224 pair step (on the device under JAX; here the
    TensorFlow backend) runs and reports a positive median rate; so does a probe's step; a step
    count that `steps_per_execution` does not divide is refused by name."""
    alexnet = ("--flagfile=configs/imagenet_alexnet_aetv2.cfg", "--batch=2", "--steps=2",
               "--repeats=1", "--steps_per_execution=2", "--precision=float32")
    proc = run_module("benchmarks.keras_step", *alexnet, "--variants=program", timeout=300)
    result = [r for r in proc.stdout.splitlines() if r.startswith("RESULT ")]
    assert len(result) == 1 and "batch=2 size=224 precision=float32" in result[0], proc.stdout
    assert float(result[0].split()[1].split("=")[1]) > 0
    probe = run_module("benchmarks.keras_step", *alexnet, "--probe=linear", "--feature=conv2",
                       timeout=300)
    assert "probe=linear feature=conv2" in probe.stdout.splitlines()[-1], probe.stdout
    bad = run_module("benchmarks.keras_step", "--steps=5", "--steps_per_execution=2",
                     check=False, timeout=120)
    assert bad.returncode == 2 and "--steps=5 must be a multiple" in bad.stderr


@pytest.mark.slow
def test_check_files_module(tmp_path):
    proc = run_module("benchmarks.check_files", f"--root={tmp_path / 'folder'}",
                      "--per_class=2", timeout=300)
    rows = [r for r in proc.stdout.splitlines() if r.startswith("| ")]
    assert len(rows) == 4 and all(float(r.split("|")[2].split()[0]) > 0 for r in rows), rows


@pytest.mark.slow
def test_readers_module(tmp_path):
    proc = run_module("benchmarks.readers", f"--root={tmp_path / 'folder'}", "--per_class=4",
                      "--batch_size=4", "--batches=2", timeout=300)
    rows = [r.split("|") for r in proc.stdout.splitlines() if r.startswith("| tf.data")
            or r.startswith("| Pillow")]
    assert len(rows) >= 3 and all(float(r[3]) > 0 for r in rows), proc.stdout


@pytest.mark.slow
def test_imagenet_input_module(tmp_path, benchmarks_md_untouched):
    proc = run_module("benchmarks.imagenet_input", f"--root={tmp_path / 'folder'}",
                      "--per_class=2", "--batch=4", "--batches=1", "--repeats=1", "--rest=0",
                      "--no_record", timeout=300)
    rows = {r.split("|")[1].strip(): r.split("|")[2] for r in proc.stdout.splitlines()
            if r.startswith("| ") and not r.startswith("| stage")}
    assert {"decode (the limit)", "now: crop for the device", "now: host pair",
            "before: host pair", "Pillow reader, 1 thread"} <= set(rows), proc.stdout


def test_the_quickstart_benchmark_reads_what_the_program_prints(configured, tmp_path,
                                                                monkeypatch, capsys):
    """`benchmarks.quickstart` parses the budget line as `run_length.budget_steps` prints it
    (the program's own printing) and the quick KNN line of `pretext_stage.quick_knn_summary`."""
    from aetv2_tf.program import run_length
    from benchmarks import quickstart

    config = configured(f"--model_dir={tmp_path}", "--train_seconds=150", "--batch_size=64",
                        "--quick_knn_train=0")
    ticks = iter(float(t) for t in range(100))
    monkeypatch.setattr(run_length.time, "perf_counter", lambda: next(ticks))

    def fit_first_steps(n, timer):
        for step in range(n):
            timer.on_train_batch_end(step)

    run_length.budget_steps(config, fit_first_steps)
    printed = capsys.readouterr().out
    knn = ("Quick KNN (the authors': k=10, Euclidean, block2 pooled 2x2; first 5000 training "
           "images vs first 1000 test images): 45.60% trained vs 41.00% random init (+4.60 "
           "points, 50 s).")
    got = quickstart.parse(printed + knn)
    assert (got["train_seconds"], got["steps"], got["pairs_per_sec"]) == (150.0, 150, 64.0)
    assert (got["knn"], got["random"], got["gain"], got["knn_seconds"]) == (45.6, 41.0, 4.6, 50)
    with pytest.raises(ValueError, match="no budget or no quick KNN line"):
        quickstart.parse(printed)
