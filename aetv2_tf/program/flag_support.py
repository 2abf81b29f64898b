"""What the program knows of each flag beside its value (`defined`), which flag values each
non-TensorFlow Keras backend refuses (`TABLE`), and the limits and parsers every program's
flags share (`strict_flags`).
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
            aet_only: bool = False, minimum: float | None = None, finite: bool = False,
            float32: bool = False,
            valid: Sequence[tuple[Callable[[Any], bool], str]] = ()) -> flags.FlagHolder:
    """Records what the program knows of the flag of ``holder``; returns ``holder``.
    ``essential``: a run resumes only with its value; ``trajectory``: a trained run resumes
    with another value only under ``--allow_flag_changes``; ``aet_only``: RotNet ignores it.
    Validators, in order: ``finite``, ``float32`` (0 or `in_float32`), ``minimum`` (None
    passes these three), then each ``(test, message)`` of ``valid``."""
    name = holder.name
    for marked, names in ((essential, _ESSENTIAL), (trajectory, _TRAJECTORY),
                          (aet_only, _AET_ONLY)):
        if marked:
            names.append(name)
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
        number = "integer" if isinstance(holder.default, int) else "number"
        flags.register_validator(name, lambda v: v is None or v >= minimum,
                                 message=f"--{name} must be >= {minimum}; pass a {kind} {number}.")
    for test, message in valid:
        flags.register_validator(name, test, message=message)
    return holder


def essential_flags() -> tuple[str, ...]:
    """The flags marked ``essential`` (`defined`), in definition order."""
    return tuple(_ESSENTIAL)


def trajectory_flags() -> tuple[str, ...]:
    """The flags marked ``trajectory`` (`defined`), in definition order."""
    return tuple(_TRAJECTORY)


def aet_only_flags() -> tuple[str, ...]:
    """The flags marked ``aet_only`` (`defined`), in definition order."""
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
    """`refused(value, present)`: True for a value a non-TensorFlow backend cannot run
    (`present`: given, not defaulted); `why`: what it needs there and the fix; `example`: one
    refused value. `unless_tensorflow_importable`: refused only where TensorFlow is not
    importable (in `stages` only, when given); `native`: `(stage, value)` pairs run anyway."""

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
    """The message of every refused flag (``given``: not defaulted); empty under TensorFlow."""
    if backend == "tensorflow":
        return []
    out, stage = [], values.get("stage")
    for name, rule in TABLE.items():
        if name not in values or not rule.refused(values[name], name in given):
            continue
        value = values[name]
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
    if found := refusals(backend, values, given):
        raise UsageError(found[0])


# --- the limits and parsers every program's flags share ----------------------------------------

#: float32 (the weights, updates and rate under every --mixed_precision): its smallest normal
#: number (smaller is 0 where denormals are flushed, as on TensorFlow's CPUs) and its largest.
FLOAT32_TINY = 2.0**-126
FLOAT32_MAX = (2.0 - 2.0**-23) * 2.0**127


def in_float32(value: float) -> bool:
    """Whether ``value`` is from `FLOAT32_TINY` to `FLOAT32_MAX` (a normal float32)."""
    return FLOAT32_TINY <= value <= FLOAT32_MAX


def as_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (infinite beyond its range), as a Python float."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


#: The largest integer flag: int32's (step counters under Keras on JAX, NumPy's seeds).
MAX_INT = 2**31 - 1
#: `--cpu_devices`: each logical device adds a traced step and no speed (64 starts in a minute).
MAX_CPU_DEVICES = 64
#: `--train_seconds`: a year; a larger budget is a typo.
MAX_TRAIN_SECONDS = 365 * 24 * 3600.0


def at_most_a_year(name: str, instead: str) -> tuple[Callable[[float], bool], str]:
    """The rule value <= `MAX_TRAIN_SECONDS` of a duration flag, with its message: what
    --``name`` must be, then ``instead``."""
    return (lambda v: v <= MAX_TRAIN_SECONDS,
            f"--{name} must be at most {MAX_TRAIN_SECONDS:.0f} (a year); {instead}")


class WholeNumberParser(flags.IntegerParser):
    """An integer flag's parser whose refusal names the fix (`--train_steps=1e21`, `=1.5`)."""

    def convert(self, argument: int | str) -> int:
        """The int of `argument` (as absl's); a ValueError that says how to write it."""
        try:
            return super().convert(argument)
        except ValueError:
            raise ValueError(f"not a whole number: write it in digits, from 0 to {MAX_INT} "
                             f"(1e6 and 1.5 are not whole numbers here)") from None


class PathParser(flags.ArgumentParser):
    """A path flag's parser: `~` and `~user` expanded (also in a flagfile), `$VARIABLES` not."""

    def parse(self, argument: str) -> str:
        """`argument` with `~` expanded; a ValueError for a NUL byte (no path holds one)."""
        if "\0" in str(argument):
            raise ValueError("a path cannot hold a NUL byte")
        return os.path.expanduser(super().parse(argument))


def strict_flags(flag_values: flags.FlagValues, modules: str | Sequence[str]) -> None:
    """For the flags of ``modules``: integers get `WholeNumberParser` and `MAX_INT`,
    `PATH_FLAGS` get `PathParser`, text must be one line. Call once, after defining them."""
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
