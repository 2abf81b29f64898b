"""The optimizer's rates that the flags give, in float32: refused where one is 0.

A rate below `flag_support.FLOAT32_TINY` is 0 where denormals are flushed: no weight would
change. Judged: the peak, the warm-up's first rate, the rate after the last ``step`` drop, the
end of ``aetv1``, and for Adam each times ``sqrt(1 - beta_2)``; a cosine's end is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from absl import logging

from aetv2_tf.errors import UsageError
from aetv2_tf.method.optimizers import AETV1_FINAL_MULTIPLIER, STEP_DROPS
from aetv2_tf.program.flag_support import FLOAT32_TINY, as_float32

#: float32's significant bits: w + s == w once |w| > |s| * 2**24.
FLOAT32_BITS = 24


def scheduled_rates(v: Mapping[str, Any]) -> list[tuple[str, float]]:
    """``(what, rate)``: the float32 rates of the schedule of the flag values ``v``."""
    peak = as_float32(v["learning_rate"])
    rates = [(f"the rate --learning_rate={v['learning_rate']:g}", peak)]
    if v["warmup_steps"] > 1:
        first = as_float32(peak * as_float32(1.0 / v["warmup_steps"]))
        rates.append((f"the warm-up's first rate (--learning_rate / --warmup_steps="
                      f"{v['warmup_steps']})", first))
    if v["lr_schedule"] == "step":
        drops = sum(int(e) < v["epochs"] for e in v["lr_drop_epochs"]) if v["lr_drop_epochs"] \
            else len(STEP_DROPS)
        if drops:
            rates.append((f"the rate after the {drops} drops of --lr_schedule=step "
                          f"(--lr_drop_factor={v['lr_drop_factor']:g})",
                          as_float32(peak * as_float32(v["lr_drop_factor"] ** drops))))
    elif v["lr_schedule"] == "aetv1":
        rates.append((f"the rate at the end of --lr_schedule=aetv1 (x{AETV1_FINAL_MULTIPLIER:g})",
                      as_float32(peak * as_float32(AETV1_FINAL_MULTIPLIER))))
    if v["optimizer"] == "adam":  # Keras: lr * sqrt(1 - beta_2^t) first, then / (1 - beta_1^t)
        root = as_float32(math.sqrt(as_float32(1.0 - as_float32(v["adam_beta2"]))))
        rates += [(f"Adam's first factor of {what} (x sqrt(1 - --adam_beta2="
                   f"{v['adam_beta2']:g}))", as_float32(rate * root)) for what, rate in rates]
    return rates


def check(v: Mapping[str, Any]) -> None:
    """`UsageError` for the first of `scheduled_rates` that is 0 in float32, else a warning
    logged for a step too small for a weight of 1 (a KNN probe: not judged)."""
    if v["stage"] == "probe" and v["probe"] == "knn":
        return
    for what, rate in scheduled_rates(v):
        if rate < FLOAT32_TINY:
            raise UsageError(
                f"{what} is {rate:.3g} in float32, below its smallest normal number "
                f"{FLOAT32_TINY:.3g} (0 where denormals are flushed, as TensorFlow does on "
                "CPUs): from there no weight would change. The weights and their updates are "
                "float32 under every --mixed_precision; raise --learning_rate (or the flag "
                "named).")
    if warning := small_step_warning(v):
        logging.warning("%s", warning)


def small_step_warning(v: Mapping[str, Any]) -> str | None:
    """A warning when Adam's peak step changes no float32 weight of size 1; else None."""
    if v["optimizer"] != "adam":
        return None
    step = as_float32(v["learning_rate"])
    largest = step * 2**FLOAT32_BITS
    if largest >= 1:
        return None
    return (f"--learning_rate={v['learning_rate']:g}: an Adam step of about {step:.3g} changes "
            f"no float32 weight larger than {largest:.3g} in size (float32 keeps "
            f"{FLOAT32_BITS} bits: w + s == w once |w| > |s| * 2**{FLOAT32_BITS}), so BatchNorm's "
            "scales (1 at the start) and most kernels would not train; raise --learning_rate "
            "(the default is 1e-05).")
