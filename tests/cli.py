"""Running the programs as a user does: `python -m aetv2_tf.<program> --flags` in a subprocess
(under Keras on JAX with TensorFlow blocked too: `run_jax`, `start_jax`), and reading what a run
wrote (TensorBoard scalars, the newest checkpoint's step)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
#: Code that makes any TensorFlow import fail (as on a machine without it), and the training
#: program run after it: `python -c RUN_TRAIN --flags` is `python -m aetv2_tf.train --flags`.
BLOCK_TF = "import sys; sys.modules['tensorflow'] = None; "
RUN_TRAIN = BLOCK_TF + ("import runpy; runpy.run_module('aetv2_tf.train', run_name='__main__', "
                        "alter_sys=True)")
#: The CIFAR-10 slice of the probe stages' tiny runs.
PROBE_SLICE = ("--train_examples=600", "--test_examples=200", "--verbose=0")


def _env(env: dict | None) -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **(env or {}))


def run_module(module: str, *args: str, timeout: float = 600, env: dict | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Runs `python -m module args...` from the repository root; returns the completed process."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=_env(env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def start_module(module: str, *args: str, log: pathlib.Path,
                 env: dict | None = None) -> subprocess.Popen:
    """Starts `python -m module args...` in the background; stdout and stderr go to `log`.out
    and `log`.err (files, so that a chatty program never blocks on a full pipe)."""
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=_env(env),
                                stdout=out, stderr=err, text=True)
    proc.log = log
    return proc


def finish(proc: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    """Waits for a `start_module` process (killed after `timeout` s); returns its outcome."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       pathlib.Path(f"{proc.log}.out").read_text(),
                                       pathlib.Path(f"{proc.log}.err").read_text())


def run_jax(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -c code args` under Keras on JAX with TensorFlow blocked, from the repository
    root; returns the completed process (its exit code unchecked)."""
    return subprocess.run([sys.executable, "-c", BLOCK_TF + code, *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, env=_env({"KERAS_BACKEND": "jax"}),
                          timeout=timeout)


def start_jax(code: str, *args, log, env: dict | None = None) -> subprocess.Popen:
    """`python -c code args` with KERAS_BACKEND=jax from the repository root, started; stdout and
    stderr together in the file `log` (`code` blocks TensorFlow itself, e.g. `RUN_TRAIN`)."""
    handle = open(log, "w")  # noqa: SIM115 - closed by `finish_jax`
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=REPO,
                            env=_env({"KERAS_BACKEND": "jax", **(env or {})}), stdout=handle,
                            stderr=subprocess.STDOUT, text=True)
    proc.handle = handle
    return proc


def finish_jax(proc: subprocess.Popen, check: bool = True, timeout: float = 300) -> str:
    """Waits for a `start_jax` process; returns its output (asserts exit 0 with `check`)."""
    proc.wait(timeout)
    proc.handle.close()
    out = pathlib.Path(proc.handle.name).read_text()
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}:\n{out[-5000:]}")
    return out


def train_args(model_dir, data_dir, *args: str) -> list[str]:
    """Flags of a tiny pretext run on real CIFAR-10 (quickstart flags, small batch and slice),
    in float32: `--mixed_precision=auto` would decide by a timing race on the test machine."""
    return ["--flagfile=configs/quickstart.cfg", f"--model_dir={model_dir}",
            f"--data_dir={data_dir}", "--batch_size=16", "--train_examples=256", "--verbose=0",
            "--quick_knn_train=0", "--mixed_precision=none", "--train_seconds=0",
            "--train_steps=8", *args]


def finished_run_args(model_dir, data_dir) -> list[str]:
    """The flags of conftest.py's `finished_run`: 6 AETv2 steps, checkpoints every 3, scalars
    every 2, image pairs every 3, exported; its length given only by --train_steps after
    quickstart.cfg's --train_seconds=150."""
    return [a for a in train_args(model_dir, data_dir, "--train_steps=6",
                                  "--checkpoint_every_steps=3", "--summary_every_steps=2",
                                  "--image_summary_every_steps=3") if a != "--train_seconds=0"]


def train(model_dir, data_dir, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """A tiny pretext run on real CIFAR-10 (quickstart flags, small batch and slice)."""
    return run_module("aetv2_tf.train", *train_args(model_dir, data_dir, *args), **kwargs)


def read_scalars(log_dir) -> dict[str, dict[int, float]]:
    """TensorBoard scalars of the event files in `log_dir`: {tag: {step: value}}."""
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator

    out: dict[str, dict[int, float]] = {}
    for path in sorted(pathlib.Path(log_dir).glob("events.out.tfevents.*")):
        acc = event_accumulator.EventAccumulator(str(path), size_guidance={"tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["tensors"]:
            for event in acc.Tensors(tag):
                value = tf.make_ndarray(event.tensor_proto)
                if value.size == 1:
                    out.setdefault(tag, {})[event.step] = float(value)
                else:
                    out.setdefault(tag, {})[event.step] = float("nan")
    return out


def scalar_events(log_dir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} in the order written, from the event files of one TensorBoard
    run directory (every event kept: a repeated step shows)."""
    import tensorflow as tf

    out: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(log_dir)):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(log_dir, name)):
            for value in event.summary.value:
                scalar = float(tf.make_ndarray(value.tensor))
                out.setdefault(value.tag, []).append((event.step, scalar))
    return out


def listed_step(model_dir: pathlib.Path) -> int:
    """The step of the newest complete checkpoint, `ckpt-<step>.weights.h5` (0 if none; a save
    cut short leaves only a temporary `.tmp<pid>-ckpt-...` file, which is not listed)."""
    from aetv2_tf.program.keras_checkpoints import list_checkpoints

    found = list_checkpoints(str(pathlib.Path(model_dir) / "checkpoints"))
    return found[-1][0] if found else 0
