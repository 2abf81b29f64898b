"""The optimizer's steps that the flags give, in float32: refused where one is 0.

The learning rate, the weights and their updates are float32 under every ``--mixed_precision``
(`flag_support.FLOAT32_TINY`), and where a rate is below float32's smallest normal number
(about 1.2e-38) it is 0 or a denormal, which TensorFlow flushes to 0 on CPUs: from that step on
no weight changes, and the run would end with "Done" as if it had trained. `check` computes,
as `method.optimizers.Schedule` and Keras's optimizers do in float32, every rate that a
schedule holds for a stretch of the run: the peak (``--learning_rate``), the warm-up's first
step (the peak / ``--warmup_steps``), the rate after the last drop of ``--lr_schedule=step``
(the peak x ``--lr_drop_factor`` ** drops) and the end of ``--lr_schedule=aetv1`` (the peak x
1e-4); for Adam also each of them times ``sqrt(1 - --adam_beta2)``, the first factor of Keras's
Adam step (``lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)``, smallest at its first step). A cosine
schedule's last steps approach 0 by design and are not judged. Any of them 0 in float32: a
`UsageError` that names it, the flags that make it and the fix, before anything is written.

`small_step_warning`: an Adam step below float32's resolution at 1 (2**-24 of it) changes no
weight larger than the step times 2**24 (BatchNorm's scales start at 1): said, not refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aetv2_tf.errors import UsageError
from aetv2_tf.method.optimizers import AETV1_FINAL_MULTIPLIER, STEP_DROPS
from aetv2_tf.program.flag_support import FLOAT32_TINY, as_float32

#: float32 keeps 24 significant bits: w + s == w once |w| > |s| * 2**24 (half a unit in its last
#: place, rounded to even).
FLOAT32_BITS = 24


def scheduled_rates(v: Mapping[str, Any]) -> list[tuple[str, float]]:
    """``(what, rate)``: the float32 rates of the run's schedule (module docstring), each
    named by the flags that make it; ``v``: the run's flag values (`RunConfig.values`)."""
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
    """`UsageError` for the first of `scheduled_rates` that is 0 in float32 (module
    docstring); only for the stages that train (a KNN probe trains nothing)."""
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


def small_step_warning(v: Mapping[str, Any]) -> str | None:
    """A warning when Adam's peak step is below float32's resolution at 1 (module docstring);
    None otherwise (SGD's step also scales with the gradient: not judged)."""
    if v["optimizer"] != "adam" or v["stage"] == "probe" and v["probe"] == "knn":
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
