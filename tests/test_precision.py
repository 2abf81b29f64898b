"""`--mixed_precision`: what `auto` picks, and that mixed_bfloat16 trains like float32.

mixed_bfloat16 is what `auto` picks on CPUs with AMX (and TPUs), so it must train correctly even
where it is not the default. Two 20-step CLI runs on the same CIFAR-10 slice with the same seed
see the same batches and the same initial weights, so their losses may differ only by bfloat16
rounding. Measured on a 2-core AVX512_BF16 CPU (seeds 0 and 1, batch 16, 512 images): the mean
loss of the 20 steps differed by 0.03% and 0.13%, the per-interval means by at most 0.5%, while
the mean loss of two runs with different seeds differed by 0.4% and successive interval means of
one run by up to 3.5% (batch-to-batch noise). The tolerances (1% and 2%) are several times the
measured bfloat16 deviation and below the batch noise, so a bfloat16 run that computed something
else (a loss in low precision, a broken cast, skipped steps) would not pass.
"""

from __future__ import annotations

import math

import pytest

from aetv2_tf import train as train_module
from benchmarks.budget import done_summary
from tests.cli import read_scalars, train


@pytest.mark.parametrize("amx, expected", [(True, "mixed_bfloat16"), (False, "float32")])
def test_auto_on_a_cpu(monkeypatch, amx, expected):
    monkeypatch.setattr(train_module, "cpu_has_amx", lambda: amx)
    monkeypatch.setattr(train_module.tf.config, "list_logical_devices", lambda kind=None: [])
    assert train_module.choose_precision("auto") == expected


@pytest.mark.parametrize("name, expected", [("none", "float32"),
                                            ("mixed_bfloat16", "mixed_bfloat16"),
                                            ("mixed_float16", "mixed_float16")])
def test_explicit_choices_pass_through(name, expected):
    assert train_module.choose_precision(name) == expected


def test_mixed_bfloat16_trains_like_float32(tmp_path, cifar10_dir):
    runs = {}
    for policy in ("none", "mixed_bfloat16"):
        model_dir = tmp_path / policy
        proc = train(model_dir, cifar10_dir, "--train_steps=20", "--train_examples=512",
                     f"--mixed_precision={policy}", "--seed=0", "--export=false",
                     "--summary_every_steps=10")
        runs[policy] = (done_summary(proc.stdout), read_scalars(model_dir / "train")["loss"])
    (f32, f32_loss), (bf16, bf16_loss) = runs["none"], runs["mixed_bfloat16"]
    for summary in (f32, bf16):
        assert int(summary["steps"]) == 20
        assert math.isfinite(float(summary["loss"]))
    assert float(bf16["loss"]) == pytest.approx(float(f32["loss"]), rel=0.01)
    assert sorted(bf16_loss) == sorted(f32_loss) == [10, 20]
    for step, value in f32_loss.items():
        assert math.isfinite(bf16_loss[step])
        assert bf16_loss[step] == pytest.approx(value, rel=0.02), step
