"""Running the programs as a user does: `python -m aetv2_tf.<program> --flags` in a subprocess."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


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


def train_args(model_dir, data_dir, *args: str) -> list[str]:
    """Flags of a tiny pretext run on real CIFAR-10 (quickstart flags, small batch and slice),
    in float32: `--mixed_precision=auto` would decide by a timing race on the test machine."""
    return ["--flagfile=configs/quickstart.cfg", f"--model_dir={model_dir}",
            f"--data_dir={data_dir}", "--batch_size=16", "--train_examples=256", "--verbose=0",
            "--quick_knn_train=0", "--mixed_precision=none", "--train_seconds=0",
            "--train_steps=8", *args]


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
