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

import json
import math
import os
import subprocess
import sys

import pytest

from aetv2_tf.program import precision
from benchmarks.budget import done_summary
from tests.cli import read_scalars, train


@pytest.mark.parametrize("rates, expected", [
    ({"float32": 20.0, "mixed_bfloat16": 60.0}, "mixed_bfloat16"),  # an AMX CPU (measured 3x)
    ({"float32": 20.0, "mixed_bfloat16": 34.8}, "mixed_bfloat16"),  # the AMD EPYC of issue 11
    ({"float32": 20.0, "mixed_bfloat16": 14.0}, "float32"),  # AVX512_BF16 without AMX (0.7x)
    ({"float32": 20.0, "mixed_bfloat16": 21.0}, "float32"),  # within the margin: keep float32
])
def test_auto_on_a_cpu_follows_the_probe_and_caches_it(tmp_path, rates, expected):
    cache = str(tmp_path / "cache" / "precision.json")
    calls = []

    def probe():
        calls.append(1)
        return rates

    first = precision.auto_cpu_policy(cache, probe=probe)
    assert first.policy == expected and first.rates == rates and "measured" in first.reason
    again = precision.auto_cpu_policy(cache, probe=probe)
    assert again.policy == expected and "cached" in again.reason
    assert len(calls) == 1, "the second run must reuse the cached decision"
    saved = json.loads(open(cache).read())
    assert saved[precision.machine_key()]["rates"] == rates


@pytest.mark.slow
def test_onednn_is_asked_for_unless_the_user_chose():
    """TensorFlow turns its oneDNN kernels on by default only on CPUs with AVX512_VNNI,
    AVX512_BF16, AVX_VNNI or AMX; `import aetv2_tf` asks for them on every CPU (1.6x on AVX2,
    BENCHMARKS.md) and keeps a user's TF_ENABLE_ONEDNN_OPTS=0. The cached `auto` decision is
    keyed by it (bfloat16 runs on oneDNN)."""
    code = ("import os, aetv2_tf, tensorflow; from aetv2_tf.program.precision import onednn_state, "
            "machine_key; print(os.environ['TF_ENABLE_ONEDNN_OPTS'], onednn_state(), "
            "machine_key().endswith('| oneDNN ' + onednn_state()))")
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    for chosen, expected in ((None, "1 on True"), ("0", "0 off True")):
        if chosen:
            env["TF_ENABLE_ONEDNN_OPTS"] = chosen
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().splitlines()[-1] == expected


def test_the_probe_takes_float32_where_bfloat16_kernels_fail(monkeypatch):
    """A CPU build without bfloat16 convolutions (seen: oneDNN capped with ONEDNN_MAX_CPU_ISA=AVX2
    on an AVX-512 CPU) makes `auto` pick float32 and say why, instead of crashing the run."""
    import tensorflow as tf

    conv2d = tf.nn.conv2d

    def float32_only(x, *args, **kwargs):
        if x.dtype == tf.bfloat16:
            raise tf.errors.InternalError(None, None, "could not create a primitive descriptor")
        return conv2d(x, *args, **kwargs)

    monkeypatch.setattr(tf.nn, "conv2d", float32_only)
    rates = precision.probe_rates(batch=2, steps=1, rounds=1)
    assert rates["mixed_bfloat16"] == 0.0 and rates["float32"] > 0
    assert precision.decide(rates) == "float32"
    assert "bfloat16 convolutions failed" in precision._rates_text(rates)


def test_a_failed_bfloat16_probe_is_not_cached_and_an_isa_cap_is_part_of_the_key(tmp_path,
                                                                               monkeypatch):
    """A bfloat16 failure may be passing (a memory shortage, an emulation's ISA cap): `auto`
    takes float32 for this run and probes again next time; a capped run has its own key."""
    cache = str(tmp_path / "precision.json")
    calls = []

    def probe():
        calls.append(1)
        return {"float32": 10.0, "mixed_bfloat16": 0.0}

    for _ in range(2):
        choice = precision.auto_cpu_policy(cache, probe=probe)
        assert choice.policy == "float32" and "failed" in choice.reason
    assert len(calls) == 2 and not os.path.exists(cache)
    plain = precision.machine_key()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert precision.machine_key() == plain + " | ONEDNN_MAX_CPU_ISA=AVX2"


def test_auto_probes_again_when_the_cache_is_corrupt_or_unwritable(tmp_path):
    cache = tmp_path / "precision.json"
    cache.write_text("{not json")
    rates = {"float32": 10.0, "mixed_bfloat16": 30.0}
    assert precision.auto_cpu_policy(str(cache), probe=lambda: rates).policy == "mixed_bfloat16"
    blocked = tmp_path / "file"
    blocked.write_text("")
    choice = precision.auto_cpu_policy(str(blocked / "sub" / "precision.json"),
                                       probe=lambda: rates)  # a file where a folder must be
    assert choice.policy == "mixed_bfloat16"


def test_the_real_probe_returns_positive_rates():
    rates = precision.probe_rates(batch=2, steps=1, rounds=1)
    assert set(rates) == {"float32", "mixed_bfloat16"} and min(rates.values()) > 0


def test_accelerators_keep_their_rules():
    """One rule for every backend: TPUs bfloat16; GPUs float16 under TensorFlow (loss scaling),
    bfloat16 under JAX; a CPU under JAX float32 (no probe: it times TensorFlow kernels)."""
    choose = precision.choose_precision
    assert choose("auto", "tensorflow", "gpu").policy == "mixed_float16"
    assert choose("auto", "jax", "gpu").policy == "mixed_bfloat16"
    assert choose("auto", "tensorflow", "tpu").policy == choose("auto", "jax", "tpu").policy \
        == "mixed_bfloat16"
    assert choose("auto", "jax", "").policy == "float32"
    assert choose("mixed_float16", "jax", "gpu").reason == "--mixed_precision=mixed_float16"


@pytest.mark.parametrize("name, expected", [("none", "float32"),
                                            ("mixed_bfloat16", "mixed_bfloat16"),
                                            ("mixed_float16", "mixed_float16")])
def test_explicit_choices_pass_through(name, expected):
    assert precision.choose_precision(name).policy == expected


@pytest.mark.slow
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
