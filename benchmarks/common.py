"""What every benchmark shares: flags, threads, interleaved timing, FLOPs, tables, BENCHMARKS.md.

The machines this runs on are small (2 cores) and shared, so a single timing means little. Every
benchmark therefore measures the configurations it compares in ONE process, interleaved
(A, B, A, B, ...), and reports medians and ratios, which the load shifts far less than absolute
rates. The load average is recorded next to every result.

Typical use, in a benchmark module::

    parser = common.parser(__doc__)
    parser.add_argument(...)
    args = parser.parse_args()
    common.configure_threads(args)          # before TensorFlow runs its first op
    ...
    times = common.interleave({"a": run_a, "b": run_b}, repeats=args.repeats)
    table = common.markdown_table(["config", "pairs/s"], rows)
    common.report("Training step", table, args, notes=[...])
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, NamedTuple

import aetv2_tf  # noqa: F401  (first: it asks for oneDNN before TensorFlow is imported)

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
DEFAULT_CIFAR10 = REPO.parent / "shared" / "data" / "cifar10" / "cifar-10-batches-py"
CPU_FLAGS = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
HEADER = """# Benchmarks

Measured with `python -m benchmarks.step`, `benchmarks.pipeline` and `benchmarks.budget` (see
`benchmarks/`). Each section is appended by a run: its date, the machine (CPU model, the flags
that decide the fast paths, cores), the TensorFlow/Keras versions, the load average and the exact
command. Configurations compared in one section were measured in one process, interleaved, so
their RATIOS are the reliable numbers; absolute rates move with the load of a shared machine.
"""


# ------------------------------------------------------------------------------------ flags
def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argparse parser with the flags every benchmark has (threads, where to record)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--intra_op", type=int, default=0,
                   help="TensorFlow intra-op threads (0: TensorFlow's default, one per core).")
    p.add_argument("--inter_op", type=int, default=0,
                   help="TensorFlow inter-op threads (0: TensorFlow's default).")
    p.add_argument("--output", type=pathlib.Path, default=BENCHMARKS_MD,
                   help="The markdown file the result section is appended to.")
    p.add_argument("--no_record", action="store_true",
                   help="Print the table only; append nothing to --output.")
    return p


def configure_threads(args: argparse.Namespace) -> None:
    """Applies --intra_op/--inter_op; must run before TensorFlow executes anything."""
    import tensorflow as tf

    if args.intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)


def keras_quiet() -> None:
    """TensorFlow's C++ info logs off (unless the caller set a level)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")


# ---------------------------------------------------------------------------------- timing
class Timing(NamedTuple):
    """One timed call: wall-clock seconds and this process's CPU seconds (all its threads)."""

    wall: float
    cpu: float


def interleave(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[Timing]]:
    """Calls every run once per round, `repeats` rounds: {name: [Timing of each call]}.

    The order within a round rotates, so no configuration always runs right after the same
    neighbour. CPU seconds say how much of the machine the process actually got: on a shared
    machine `work / cpu` is far steadier than `work / wall` (spinning worker threads count as
    busy, so it is a lower bound of the unloaded rate per core). A run that returns a `Timing`
    measured it itself (a worker process: `benchmarks.backends`); that one is recorded instead.
    """
    names = list(runs)
    out: dict[str, list[Timing]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            w0, c0 = time.perf_counter(), time.process_time()
            own = runs[name]()
            timing = Timing(time.perf_counter() - w0, time.process_time() - c0)
            out[name].append(own if isinstance(own, Timing) else timing)
    return out


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def spread(values: Sequence[float]) -> str:
    """`min-max` of the per-round rates as a percentage around their median: how noisy it was."""
    m = median(values)
    return f"{100 * (min(values) / m - 1):+.0f}/{100 * (max(values) / m - 1):+.0f}%"


# ------------------------------------------------------------------------------------ FLOPs
def forward_macs(model) -> int:
    """Multiply-accumulates of one forward pass of ONE example through `model`'s conv/dense layers.

    Counted analytically from the built layers: a Conv2D makes `H_out W_out k_h k_w C_in C_out`
    MACs, a Dense `in out`. Batch norm, ReLU, pooling and the loss are left out (a few percent of
    the arithmetic, and bandwidth-bound anyway). Nested models are walked.
    """
    import keras

    total = 0
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            _, h, w, _ = layer.output.shape
            total += h * w * kh * kw * cin * cout // layer.groups
        elif isinstance(layer, keras.layers.Dense):
            total += layer.kernel.shape[0] * layer.kernel.shape[1]
    return int(total)


def train_step_flops(forward_macs_per_example: int, examples_per_item: int = 1) -> float:
    """FLOPs of one training step per item: 2 FLOPs a MAC, and backward ~ 2x forward.

    (The backward pass of the first layer skips the input gradient, so this overstates the work
    by ~1%; it is the usual 3x rule.)
    """
    return 3 * 2 * forward_macs_per_example * examples_per_item


def make_matmul(dtype: str, n: int = 4096) -> Callable[[], None]:
    """A callable running one `n x n @ n x n` matmul in `dtype` to completion (traced, warmed up).

    Its FLOPs are `matmul_flops(n)`; time it next to the model to get the machine's peak under
    the same load.
    """
    import tensorflow as tf

    a = tf.cast(tf.random.stateless_normal((n, n), (1, 2)), dtype)
    b = tf.cast(tf.random.stateless_normal((n, n), (3, 4)), dtype)
    matmul = tf.function(lambda x, y: tf.cast(tf.matmul(x, y)[0, 0], "float32"))

    def run() -> None:
        matmul(a, b).numpy()

    run()
    return run


def matmul_flops(n: int = 4096) -> float:
    return 2.0 * n**3


# ---------------------------------------------------------------------------- the machine
def cpu_flags() -> set[str]:
    """The flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def machine_line() -> str:
    """One line: CPU model, the relevant flags (present/absent), cores, TF/Keras/Python."""
    import keras
    import tensorflow as tf

    from aetv2_tf.program.precision import onednn_state

    flags = cpu_flags()
    marks = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in CPU_FLAGS)
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    kernels = f"oneDNN {onednn_state()}" + (f", ONEDNN_MAX_CPU_ISA={cap}" if cap else "")
    return (f"{cpu_model()}; {marks}; {cores()} cores; TensorFlow {tf.__version__} ({kernels}), "
            f"Keras {keras.__version__}, Python {platform.python_version()}")


# --------------------------------------------------------------------------------- output
def line_writer(*streams: IO[str], prefix: str = "") -> Callable[[str], None]:
    """A sink for `tee`: writes ``prefix`` + each line to every stream, flushed at once."""
    def write(line: str) -> None:
        for stream in streams:
            stream.write(prefix + line)
            stream.flush()

    return write


def tee(stream: IO[str], *sinks: Callable[[str], object]) -> threading.Thread:
    """Copies each line of ``stream`` (a child process's text output) to every sink as soon as
    it is read, in a daemon thread, until the stream ends; returns the thread (join it once the
    child has ended). What a killed command leaves in a file is then all but its last line."""
    def copy() -> None:
        for line in stream:
            for sink in sinks:
                sink(line)

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub markdown table; floats keep the caller's formatting (pass strings)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line() -> str:
    """The exact command that is running, as a user would type it."""
    module = pathlib.Path(sys.argv[0]).stem
    package = pathlib.Path(sys.argv[0]).parent.name
    head = f"python -m {package}.{module}" if package == "benchmarks" else sys.argv[0]
    return " ".join([head, *map(shlex.quote, sys.argv[1:])])


def report(title: str, table: str, args: argparse.Namespace, notes: Sequence[str] = (),
           load_before: str | None = None) -> str:
    """Prints the table, and appends a dated section to `args.output` unless `--no_record`.

    `load_before` is the load average when the measurement started (the end one is added).
    Returns the section's markdown.
    """
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    load = f"{load_before} at the start, {load_average()} at the end" if load_before \
        else load_average()
    lines = [f"## {title} ({stamp})", "", f"- Machine: {machine_line()}",
             f"- Load average (1/5/15 min): {load}", f"- Command: `{command_line()}`",
             *[f"- {note}" for note in notes], "", table, ""]
    section = "\n".join(lines)
    print(table, flush=True)
    if not args.no_record:
        output = pathlib.Path(args.output)
        existing = output.read_text() if output.exists() else HEADER
        output.write_text(existing.rstrip("\n") + "\n\n" + section)
        print(f"Appended to {output}", flush=True)
    return section
