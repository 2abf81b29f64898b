"""What the program knows of each flag beside its value, written where the flag is defined.

`defined` records, in the flag's own module of `aetv2_tf.program.flags`, whether a resumed run
must keep the flag (`essential`), whether it changes a pretraining run's course (`trajectory`)
and the checks absl runs while parsing (exit 1 with a message that names the flag and the fix).

`TABLE`: which flag values each Keras backend runs, checked before anything is written. A row
is a `Rule`: the values that the backends other than TensorFlow refuse, with what the flag
needs there and the fix; a flag without a row runs everywhere, and TensorFlow runs every flag.
A refusal is a `UsageError` that names the flag, the backend and the fix.

Also the limits and parsers that every program's flags share (`strict_flags`): integer flags
take digits up to `MAX_INT`, and path flags expand `~` wherever they are given.
"""
from __future__ import annotations

import functools
import math
import os
import struct
import types
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from absl import flags

from aetv2_tf.errors import UsageError

_ESSENTIAL: list[str] = []
_TRAJECTORY: list[str] = []
_AET_ONLY: list[str] = []


def defined(holder: flags.FlagHolder, *, essential: bool = False, trajectory: bool = False,
            aet_only: bool = False, minimum: int | None = None, finite: bool = False,
            float32: bool = False,
            valid: Sequence[tuple[Callable[[Any], bool], str]] = ()) -> flags.FlagHolder:
    """Records, where the flag of ``holder`` is defined, what the program needs to know of it
    beside its value; returns ``holder``. ``essential``: a run resumes only with the value it
    started with (`essential_flags`); ``trajectory``: a pretraining run that has trained
    resumes with another value only under ``--allow_flag_changes`` (`trajectory_flags`);
    ``aet_only``: only the AET pretext reads it (`aet_only_flags`: RotNet ignores it). The
    checks absl runs while parsing, in this order: ``finite`` (no inf or nan), ``float32`` (a
    number the loss or the optimizer computes with: 0, or a size float32 holds, `in_float32`),
    ``minimum`` (an integer flag's lower bound) and each ``(test, message)`` of ``valid``; None
    (the flag not set) passes the first three."""
    name = holder.name
    if essential:
        _ESSENTIAL.append(name)
    if trajectory:
        _TRAJECTORY.append(name)
    if aet_only:
        _AET_ONLY.append(name)
    if finite:
        flags.register_validator(name, lambda v: v is None or math.isfinite(v),
                                 message=f"--{name} must be a finite number, not inf or nan.")
    if float32:
        flags.register_validator(
            name, lambda v: v is None or v == 0 or in_float32(abs(v)),
            message=f"--{name} must be 0 or of a size from {FLOAT32_TINY:.3g} to "
                    f"{FLOAT32_MAX:.3g}: the loss and the optimizer compute in float32, where "
                    "a smaller size is 0 and a larger one infinite.")
    if minimum is not None:
        kind = "non-negative" if minimum == 0 else "positive"
        flags.register_validator(name, lambda v: v is None or v >= minimum,
                                 message=f"--{name} must be >= {minimum}; pass a {kind} integer.")
    for test, message in valid:
        flags.register_validator(name, test, message=message)
    return holder


def essential_flags() -> tuple[str, ...]:
    """The flags marked ``essential`` (`defined`), in the order they were defined."""
    return tuple(_ESSENTIAL)


def trajectory_flags() -> tuple[str, ...]:
    """The flags marked ``trajectory`` (`defined`), in the order they were defined."""
    return tuple(_TRAJECTORY)


def aet_only_flags() -> tuple[str, ...]:
    """The flags marked ``aet_only`` (`defined`), in the order they were defined."""
    return tuple(_AET_ONLY)


def ignored_by_rotnet(values: Mapping[str, Any], given: Collection[str]) -> str | None:
    """A warning naming the flags ``given`` that only the AET pretext reads, under RotNet."""
    ignored = [f"--{name}={values[name]}" for name in sorted(given) if name in _AET_ONLY]
    if not (values["stage"] == "pretext" and values["pretext"] == "rotation" and ignored):
        return None
    return (f"{', '.join(ignored)}: ignored by --pretext=rotation (RotNet: a cross-entropy over "
            "4 rotations of each image, no homography, no decoder); drop them, or pass "
            "--pretext=aet to train with them.")


@dataclass(frozen=True)
class Rule:
    """`refused(value, present)` is True for the values a non-TensorFlow backend cannot run
    (`present`: the flag was given, not defaulted); `why` says what the flag needs there and
    the fix; `example` is one refused value (the table's test uses it); with
    `unless_tensorflow_importable` the value is refused only where TensorFlow cannot be
    imported (the adapter then uses TensorFlow beside the backend), and, when `stages` is not
    empty, only in those `--stage` values; `native` lists `(stage, value)` pairs that the
    backend runs by itself although `refused` says otherwise."""

    refused: Callable[[Any, bool], bool]
    why: str
    example: Any
    unless_tensorflow_importable: bool = False
    stages: tuple[str, ...] = ()
    native: tuple[tuple[str, Any], ...] = ()


#: The rules of the flags that a backend other than TensorFlow may refuse, by flag name.
TABLE: Mapping[str, Rule] = types.MappingProxyType({
    "dataset": Rule(lambda v, _: v != "cifar10",
                    "is read by tf.data (tensorflow-datasets, image folders), which the probe "
                    "stages use beside this backend where TensorFlow is importable; pretraining "
                    "here reads CIFAR-10's python files or image folders (Pillow): use "
                    "--dataset=cifar10 or --dataset=folder", "imagenet2012",
                    unless_tensorflow_importable=True, stages=("probe", "supervised"),
                    native=(("pretext", "folder"),)),
    "download": Rule(lambda v, _: bool(v),
                     "is tensorflow-datasets' download; prepare the data under TensorFlow once, "
                     "or pass --data_dir=<cifar-10-batches-py>", True),
    "strategy": Rule(lambda v, _: v not in ("auto", "default"),
                     "is a tf.distribute strategy; every local device is used by itself "
                     "(keras.distribution.DataParallel): drop --strategy", "mirrored"),
    "collective_timeout_seconds": Rule(
        lambda v, present: present, "times out tf.distribute's multi-worker collectives; drop "
        "it", 60),
    "tpu": Rule(lambda v, _: bool(v),
                "is tf.distribute's TPU resolver; drop --tpu (JAX finds TPUs)", "local"),
    "cpu_devices": Rule(lambda v, _: v != 1,
                        "splits a CPU in tf.config; drop it (XLA_FLAGS="
                        "--xla_force_host_platform_device_count=N does this for JAX)", 2),
    "deterministic": Rule(lambda v, _: bool(v),
                          "is TensorFlow's op determinism; drop it (XLA_FLAGS="
                          "--xla_gpu_deterministic_ops=true on JAX GPUs)", True),
    "image_summary_every_steps": Rule(
        lambda v, _: v > 0, "draws the image pairs into TensorBoard, and TensorFlow is not "
        "importable here; drop it (the scalars are in train/log.csv)", 100,
        unless_tensorflow_importable=True),
    "warp": Rule(lambda v, _: v == "host",
                 "places the warp of the TensorFlow program's tf.data pairs; this backend makes "
                 "its pairs on the device (models.pairs): drop --warp", "host"),
    "data_service": Rule(lambda v, _: bool(v),
                         "is a tf.data service, which serves the TensorFlow program's pipeline; "
                         "drop it, or train under KERAS_BACKEND=tensorflow",
                         "grpc://localhost:5050"),
    "export": Rule(lambda v, present: bool(v) and present,
                   "writes a TensorFlow SavedModel and TensorFlow is not importable here; pass "
                   "--export=false (the encoder is in <model_dir>/encoder.weights.h5: export it "
                   "later with `python -m aetv2_tf.export --model_dir=...` where TensorFlow is "
                   "installed)", True, unless_tensorflow_importable=True),
})


@functools.cache
def tensorflow_importable() -> bool:
    """True when `import tensorflow` works here (cached; imports it once)."""
    from aetv2_tf.program import console

    try:
        with console.quiet_native_stderr(not console.verbose_requested()):
            import tensorflow  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, blocked or broken: all mean "not here"
        return False
    return True


def refusals(backend: str, values: Mapping[str, Any], given: Collection[str]) -> list[str]:
    """The messages of every refused flag: ``values`` maps a flag's name to its value (the
    run's, `config.RunConfig.values`), ``given`` names those given on the command line or in a
    flagfile (not defaulted). Empty under TensorFlow."""
    if backend == "tensorflow":
        return []
    out = []
    stage = values.get("stage")
    for name, rule in TABLE.items():
        if name not in values:
            continue
        value = values[name]
        if not rule.refused(value, name in given):
            continue
        stage_ok = not rule.stages or stage in rule.stages
        if rule.unless_tensorflow_importable and stage_ok and tensorflow_importable():
            continue
        if (stage, value) in rule.native:
            continue
        shown = str(value).lower() if isinstance(value, bool) else value
        out.append(f"--{name}={shown} is not available with KERAS_BACKEND={backend}: it "
                   f"{rule.why} (or run with KERAS_BACKEND=tensorflow).")
    return out


def check(backend: str, values: Mapping[str, Any], given: Collection[str]) -> None:
    """Raises `UsageError` with the first refusal of `refusals`."""
    found = refusals(backend, values, given)
    if found:
        raise UsageError(found[0])


# --- the limits and parsers every program's flags share ----------------------------------------

#: float32 is the dtype of the weights, of their updates and of the learning rate under every
#: --mixed_precision: a mixed policy computes the layers in bfloat16 or float16 but keeps the
#: variables and the optimizer in float32 (tests/test_flag_values_are_in_range.py trains at a
#: rate that is 0 in float16). Its smallest normal number (a smaller one is 0 where denormals
#: are flushed, as TensorFlow does on CPUs) and its largest.
FLOAT32_TINY = 2.0**-126
FLOAT32_MAX = (2.0 - 2.0**-23) * 2.0**127


def in_float32(value: float) -> bool:
    """Whether ``value`` is a positive normal float32 number: from `FLOAT32_TINY` to
    `FLOAT32_MAX` (neither 0 nor a denormal nor infinite there)."""
    return FLOAT32_TINY <= value <= FLOAT32_MAX


def as_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (infinite beyond its range), as a Python float."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


#: The largest value of an integer flag (steps, epochs, examples, seeds, intervals, seconds):
#: int32's. A step counter is an int32 under Keras on JAX (no x64) and NumPy's seeds stop at
#: 2**32: a larger count (`--train_steps=10**21`) would end in a traceback deep in the run.
MAX_INT = 2**31 - 1
#: `--cpu_devices`: logical devices on one CPU share its cores (they exercise the mirrored path,
#: they add no speed) and Keras traces the train step once per replica, so more only stalls the
#: start: 100000 hangs before the first step, 64 starts within a minute.
MAX_CPU_DEVICES = 64
#: `--train_seconds`: a year. A larger budget is a typo, and its step count would pass MAX_INT.
MAX_TRAIN_SECONDS = 365 * 24 * 3600.0


class WholeNumberParser(flags.IntegerParser):
    """An integer flag's parser whose refusal names the fix (`--train_steps=1e21`, `=1.5`)."""

    def convert(self, argument: int | str) -> int:
        """The int of `argument` (digits; 0x/0o prefixes as absl's); a ValueError that says how
        to write it otherwise."""
        try:
            return super().convert(argument)
        except ValueError:
            raise ValueError(f"not a whole number: write it in digits, from 0 to {MAX_INT} "
                             f"(1e6 and 1.5 are not whole numbers here)") from None


class PathParser(flags.ArgumentParser):
    """A path flag's parser: `~` and `~user` are expanded, as the shell does on a command line,
    so that a flagfile's `--model_dir=~/runs/x` names the same directory (absl already expands
    `--flagfile=~/...`). `$VARIABLES` are left alone: a path may hold a `$`, and the shell has
    expanded them on the command line already."""

    def parse(self, argument: str) -> str:
        """`argument` with `~` expanded; a ValueError for a NUL byte (no path holds one)."""
        if "\0" in str(argument):
            raise ValueError("a path cannot hold a NUL byte")
        return os.path.expanduser(super().parse(argument))


def strict_flags(flag_values: flags.FlagValues, modules: str | Sequence[str]) -> None:
    """Every integer flag of the ``modules`` (a module's name, or the names its flags were
    defined under) gets `WholeNumberParser` and the upper bound `MAX_INT`; every flag named in
    `PATH_FLAGS` gets `PathParser`; every text flag is one line (of flags.cfg). Call
    once, after defining the flags."""
    modules = (modules,) if isinstance(modules, str) else tuple(modules)
    for flag in (f for module in modules for f in flag_values.get_flags_for_module(module)):
        if isinstance(flag.parser, flags.IntegerParser):
            flag.parser = WholeNumberParser()
            flags.register_validator(
                flag.name, lambda v: v is None or v <= MAX_INT, flag_values=flag_values,
                message=f"--{flag.name} must be at most {MAX_INT} (2**31 - 1, the int32 range "
                        "of step counters and seeds); pass a smaller whole number.")
        elif flag.name in PATH_FLAGS:
            flag.parser = PathParser()
        if flag.flag_type() == "string":  # a list is refused a line break by its parser
            flags.register_validator(
                flag.name, lambda v: not set("\n\r\0") & set(v or ""),
                flag_values=flag_values, message=f"--{flag.name} must be one line of text: a "
                "line break would split it in the run's flags.cfg (a NUL byte would end it).")


#: The flags that name a file or a directory (of `aetv2_tf.program.flags`, `aetv2_tf.report`).
PATH_FLAGS = ("data_dir", "model_dir", "pretrained", "output")
