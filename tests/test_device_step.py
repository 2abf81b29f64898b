"""The prepared GPU measurement (`benchmarks.device_step`, BENCHMARKS.md "GPU step: the prepared
measurement"): the device command at tiny size on the CPU, run as the device runs it (its
command line through bash, Keras on JAX with TensorFlow blocked in every process), all three
parts reporting (the PyTorch peer says "torch not installed" where PyTorch is missing, as in
this project's environment); what a killed part leaves; the parts' clocks counting compilation;
and the sizing of the command within a loan."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks import device_step
from benchmarks.device_step import Clock, Records
from benchmarks.torch_peer import DEVICE_VARIANTS
from tests.cli import REPO

PIECES = ("pairs", "encoder_two_pass", "encoder_one_pass", "loss_svd", "loss_newton",
          "optimizer", "step_in_loop", "step_resident", "step_dispatched")


@pytest.mark.slow
def test_the_device_command_at_tiny_size(tmp_path, capsys):
    site = tmp_path / "site"  # what stands for the wheels' /tmp/site: TensorFlow blocked
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    out = tmp_path / "out"
    command = device_step.device_command(sys.executable, str(site), " --tiny", install=False)
    env = dict(os.environ, OUT=str(out),
               # XLA's cheaper CPU compilation: the same programs, compiled in half the time.
               XLA_FLAGS="--xla_backend_optimization_level=0 "
                         "--xla_llvm_disable_expensive_passes=true")
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["console.txt", "device_step.json",
                                                     "device_step.jsonl"]
    results = json.loads((out / "device_step.json").read_text())
    gathered = device_step.gather(out / "device_step.jsonl")  # what a cut run would give
    for part in ("keras", "breakdown", "torch"):
        assert {k: v for k, v in results[part].items() if k != "exit"} == gathered[part]

    keras = results["keras"]
    assert keras["exit"]["exit"] == 0 and keras["setup"]["backend"] == "jax"
    assert keras["setup"]["batch"] == 8
    rows = {n: keras[n] for n in ("two_pass", "one_pass", "one_pass_newton")}
    assert [row["batch_groups"] for row in rows.values()] == [1, 2, 2]
    assert [row["projection"] for row in rows.values()] == ["svd", "svd", "newton"]
    for row in rows.values():
        assert row["pairs_per_s"] > 0 and row["first_execution_s"] > 0
        assert row["repeats"] == row["rates"] and row["first"] == "two_pass"
        # bfloat16: one call or two move the loss and the gradients no more than bfloat16
        # itself does against the float32 step (about 3e-2 of the largest gradient here)
        assert row["loss_vs_first"] <= 1e-2 * row["loss"]
        assert row["grad_vs_first"] <= 0.1 and row["grad_vs_float32"] <= 0.1

    breakdown = results["breakdown"]
    assert breakdown["exit"]["exit"] == 0, breakdown
    for piece in PIECES:
        assert breakdown[piece]["ms"] > 0, piece
    assert breakdown["step_resident"]["resident_bytes"] == 64 * 32 * 32 * 3
    assert breakdown["step_in_loop"]["pairs_per_s"] > 0

    torch = results["torch"]
    assert torch["exit"]["exit"] == 0
    if importlib.util.find_spec("torch") is None:
        assert torch["setup"] == {"torch": "torch not installed"} and set(torch) == {
            "setup", "exit"}
        assert "torch: torch not installed" in proc.stdout
    else:
        assert all(torch[n]["pairs_per_s"] > 0 for n in DEVICE_VARIANTS)

    console = (out / "console.txt").read_text()
    assert console == proc.stdout  # everything printed, the parts' lines as they came
    heads = [line.split(" (")[0].split(":")[0] for line in console.splitlines()
             if line.startswith("== ")]
    assert heads == ["== keras", "== keras", "== breakdown", "== breakdown", "== torch",
                     "== torch", "== summary"]
    assert "RESULT pairs_per_s=" in console and "| keras one_pass_newton |" in console
    table = console.split("== summary\n")[1].splitlines()[:-1]
    assert device_step.main([f"--summary={out}"]) == 0  # a returned folder's table, again
    assert capsys.readouterr().out.splitlines() == table


def test_a_killed_part_leaves_every_record_it_wrote(tmp_path, monkeypatch):
    """A part cut at its limit is killed with what it started; its records, each written and
    synced as measured, stay and are gathered; a line cut mid-write is left out."""
    jsonl = tmp_path / device_step.JSONL
    script = ("import time; from benchmarks.device_step import Records; "
              f"r = Records(__import__('pathlib').Path({str(jsonl)!r}), 'keras'); "
              "r.add('two_pass', 'rate', 'two_pass: 7 pairs/s', pairs_per_s=7.0); "
              "r.add('one_pass', 'repeat', 'one_pass: repeat 0', pairs_per_s=5.0); "
              "import subprocess; subprocess.Popen(['sleep', '60']); time.sleep(60)")
    monkeypatch.setattr(device_step, "part_command",
                        lambda part, args, deadline: [sys.executable, "-c", script])
    said = []
    begin = time.monotonic()
    outcome = device_step.run_part("keras", None, 6, said.append)
    assert outcome["exit"] == "timed out" and time.monotonic() - begin < 30
    assert "two_pass: 7 pairs/s\n" in said and "one_pass: repeat 0\n" in said
    with open(jsonl, "a") as f:
        f.write('{"part": "keras", "name": "one_pa')  # the kill's half line
    assert device_step.gather(jsonl) == {"keras": {"two_pass": {"pairs_per_s": 7.0},
                                                   "one_pass": {"repeats": [5.0]}}}
    assert device_step.summary({"keras": device_step.gather(jsonl)["keras"]})[2:] == [
        "| keras two_pass | 7 | 1.00 |"]


def test_a_clock_counts_the_compilation_ahead(tmp_path, capsys):
    records = Records(tmp_path / "r.jsonl", "breakdown")
    clock = Clock(time.time() + 30, compile_s=21.0)
    assert not clock.allows(records, "step_in_loop", 1.0, 10)  # 21 + 10 > 30
    assert clock.allows(records, "loss_svd", 0.1, 10)
    clock.compiled(4.0)  # this machine compiles a step in 4 s
    assert clock.allows(records, "step_in_loop", 1.0, 10)
    skipped = json.loads((tmp_path / "r.jsonl").read_text())
    assert skipped["name"] == "step_in_loop" and skipped["event"] == "skipped"
    assert skipped["need_s"] == 31.0 and "skipped: it needs about 31 s" in capsys.readouterr().out


def test_the_device_command_fits_a_loan_and_is_the_one_documented():
    """A loan: 15 minutes of device time, a machine's start of up to 4 included; the command
    (the wheels' install and the parts' limits) inside its timeout, the whole call inside the
    loan with the transfers and the 30 s a machine stays warm; BENCHMARKS.md has it as made."""
    assert device_step.PLAN_S + 20 <= device_step.TIMEOUT_S <= 600
    assert 4 * 60 + device_step.TIMEOUT_S + 60 + 30 <= 15 * 60
    assert device_step.device_call() in (REPO / "BENCHMARKS.md").read_text()
