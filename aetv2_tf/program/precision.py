"""`--mixed_precision`: the Keras dtype policy, and on a CPU `auto` decided by measurement.

Whether bfloat16 beats float32 on a CPU depends on the CPU (BENCHMARKS.md), so `auto` times a
NIN block's convolutions in both and picks bfloat16 only when `MARGIN` times faster; the
decision is cached per machine (`machine_key`) in `$AETV2_CACHE_DIR` (default
`$XDG_CACHE_HOME/aetv2_tf` or `~/.cache/aetv2_tf`).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from typing import NamedTuple

from aetv2_tf.errors import UsageError
from aetv2_tf.files.digests import sha256
from aetv2_tf.files.safe_paths import read_json, write_atomically

MARGIN = 1.1  # bfloat16 must beat float32 by 10% to be chosen
PROBE_POLICIES = ("float32", "mixed_bfloat16")


class Choice(NamedTuple):
    """The policy to use, why, and the probe's rates (steps/s per policy) when one ran."""

    policy: str
    reason: str
    rates: dict | None = None


def cpu_model() -> tuple[str, str]:
    """The CPU's model name and a digest of its feature flags (VMs share generic names)."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not flags:
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = " ".join(sorted(value.split()))
                    break
    except OSError:
        pass
    return name, sha256([flags.encode()])[:10]


def onednn_state() -> str:
    """Whether TensorFlow runs its oneDNN CPU kernels here: "on", "off" or "unknown"."""
    try:
        from tensorflow.python.util import _pywrap_util_port

        return "on" if _pywrap_util_port.IsMklEnabled() else "off"
    except (ImportError, AttributeError):  # a private module of TensorFlow's
        return "unknown"


def machine_key() -> str:
    """The cache key: CPU model and flags, visible cores, TF version, oneDNN and its ISA cap."""
    import tensorflow as tf

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    name, flags = cpu_model()
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return (f"{name} (flags {flags}) | {cores} cores | tensorflow {tf.__version__} | "
            f"oneDNN {onednn_state()}" + (f" | ONEDNN_MAX_CPU_ISA={cap}" if cap else ""))


def cache_file() -> str:
    base = os.environ.get("AETV2_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "aetv2_tf")
    return os.path.join(base, "precision.json")


def decide(rates: dict[str, float], margin: float = MARGIN) -> str:
    """The faster policy of the probe's `rates` (bfloat16 only if >= `margin` x float32)."""
    bf16, fp32 = rates["mixed_bfloat16"], rates["float32"]
    return "mixed_bfloat16" if bf16 >= margin * fp32 else "float32"


def probe_rates(batch: int = 16, steps: int = 4, rounds: int = 3) -> dict[str, float]:
    """Steps/s of NIN block 2's convolutions (5x5x96 -> 192, 1x1 -> 192, 1x1 -> 192 on 16x16
    maps) forward and backward, in float32 and bfloat16, interleaved (0.0: failed)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    shapes = [(5, 5, 96, 192), (1, 1, 192, 192), (1, 1, 192, 192)]
    kernels32 = [tf.constant(rng.normal(0, 0.05, s), tf.float32) for s in shapes]
    x32 = tf.constant(rng.normal(size=(batch, 16, 16, 96)), tf.float32)

    def make_step(dtype):
        kernels = [tf.cast(k, dtype) for k in kernels32]
        x = tf.cast(x32, dtype)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                tape.watch(kernels)
                h = x
                for k in kernels:
                    h = tf.nn.relu(tf.nn.conv2d(h, k, 1, "SAME"))
                loss = tf.reduce_sum(tf.cast(h, tf.float32))
            return tape.gradient(loss, kernels)

        return step

    fns = {"float32": make_step(tf.float32), "mixed_bfloat16": make_step(tf.bfloat16)}
    best = dict.fromkeys(fns, float("inf"))
    for name, fn in list(fns.items()):  # trace and warm up
        try:
            tf.nest.map_structure(lambda g: g.numpy(), fn())
        except tf.errors.OpError as e:  # no bfloat16 kernel here: rate 0
            if name == "float32":
                raise
            from absl import logging

            logging.warning("--mixed_precision=auto: the bfloat16 probe step failed, so float32 "
                            "(%s)", (e.message or str(e)).strip().splitlines()[0][:300])
            del fns[name]
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                out = fn()
            out[0].numpy()
            best[name] = min(best[name], (time.perf_counter() - t0) / steps)
    return {name: round(1.0 / t, 2) for name, t in best.items()}  # 1/inf = 0.0 where it failed


def _load_cache(path: str) -> dict:
    try:
        data = read_json(path)  # a regular file of at most 1 MiB
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def auto_cpu_policy(path: str | None = None,
                    probe: Callable[[], dict[str, float]] = probe_rates) -> Choice:
    """`auto` on a CPU: the cached decision for this machine, else `probe()` and cache it (an
    unusable cache is no error; a failed bfloat16 probe is not cached)."""
    path = path or cache_file()
    key = machine_key()
    cached = _load_cache(path).get(key)
    if isinstance(cached, dict) and cached.get("policy") in PROBE_POLICIES:
        return Choice(cached["policy"], f"auto: cached measurement for this CPU "
                      f"({_rates_text(cached.get('rates'))}; {path})", cached.get("rates"))
    rates = probe()
    policy = decide(rates)
    if rates["mixed_bfloat16"]:
        _store(path, key, dict(policy=policy, rates=rates, margin=MARGIN,
                               measured=time.strftime("%Y-%m-%d %H:%M:%S")))
    return Choice(policy, f"auto: measured on this CPU ({_rates_text(rates)})", rates)


def _store(path: str, key: str, entry: dict) -> None:
    """Adds `entry` under `key` to the cache file (atomically); an unwritable cache is no error."""
    data = _load_cache(path)
    data[key] = entry
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomically(path, json.dumps(data, indent=1))
    except (OSError, UsageError):  # UsageError: a link or a folder at `path`, left alone
        pass


def _rates_text(rates: dict | None) -> str:
    if not rates:
        return "no rates"
    if not rates["mixed_bfloat16"]:
        return "bfloat16 convolutions failed in a NIN-block probe"
    ratio = rates["mixed_bfloat16"] / rates["float32"]
    return f"bfloat16 {ratio:.2f}x float32 in a NIN-block probe"


def choose_precision(name: str, backend: str = "tensorflow", accelerator: str = "") -> Choice:
    """The Keras dtype policy for `--mixed_precision`, with the reason (`accelerator`: "tpu",
    "gpu" or "" for a CPU). `auto`: mixed_bfloat16 on TPUs; on GPUs mixed_float16 under
    TensorFlow, else mixed_bfloat16; on CPUs `auto_cpu_policy` under TensorFlow, else float32
    (BENCHMARKS.md)."""
    if name == "none":
        return Choice("float32", "--mixed_precision=none")
    if name != "auto":
        return Choice(name, f"--mixed_precision={name}")
    if accelerator == "tpu":
        return Choice("mixed_bfloat16", "auto: TPU")
    if accelerator:
        policy = "mixed_float16" if backend == "tensorflow" else "mixed_bfloat16"
        return Choice(policy, f"auto: {accelerator.upper()}")
    if backend != "tensorflow":
        return Choice("float32", f"auto: CPU under {backend}")
    return auto_cpu_policy()
