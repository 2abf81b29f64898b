"""Step configurations of another Keras backend (or of TensorFlow with its oneDNN kernels set
otherwise than in this process: `/eigen`), timed by a worker process of that kind.

A process has one Keras backend, so `benchmarks.step` (TensorFlow) hands a configuration such as
`jax:keras/fp32/geodesic` to a worker, `KERAS_BACKEND=jax python -m benchmarks.backends ...`,
which builds and warms up the same `StepRunner` (`benchmarks.step_runner`) there and then times
one round whenever asked. The parent calls it inside its interleaved rounds like a local
configuration, so both backends are measured in the same rounds, under the same load. One
worker per kind; its protocol, one line each way (other output of the worker is library
chatter, kept for error messages):

    parent -> worker:  `run NAME STEPS`              worker -> parent: `@@timing WALL CPU`
                       (end of input: exit)                            `@@built NAME SECONDS POLICY
                                                                        [oneDNN=on|off]`
                                                                       `@@ready FLOPS_PER_PAIR`

WALL and CPU are the worker's own seconds (`time.perf_counter`, `time.process_time`: all its
threads) around the round, so the parent's bookkeeping is not timed.
"""

from __future__ import annotations

import argparse
import atexit
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import common


class Worker:
    """A worker process of one kind (`Spec.worker`: a backend, or TensorFlow with oneDNN off) for
    some configurations (`Spec`s of that kind)."""

    def __init__(self, kind: str, specs: list, batch_size: int, warmup: int,
                 threads: tuple[int, int] = (0, 0)):
        backend, _, eigen = kind.partition("-")
        self.backend, self.names = kind, [s.name for s in specs]
        env = dict(os.environ, KERAS_BACKEND=backend)
        if backend == "tensorflow":  # before TensorFlow is imported there
            env["TF_ENABLE_ONEDNN_OPTS"] = "0" if eigen else "1"
        self.log = tempfile.TemporaryFile("w+")  # the worker's stderr, for error messages
        module = "benchmarks.torch_peer" if backend == "torch" else "benchmarks.backends"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, f"--configs={','.join(self.names)}",
             "--steps_per_execution=" + ",".join(str(s.steps_per_execution) for s in specs),
             f"--batch_size={batch_size}", f"--warmup={warmup}",
             *([f"--intra_op={threads[0]}", f"--inter_op={threads[1]}"]
               if backend == "tensorflow" else [])],
            cwd=common.REPO, env=env, text=True, bufsize=1,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        atexit.register(self.close)
        self.flops = 0.0

    def expect(self, kind: str) -> list[str]:
        """The fields of the worker's next `@@kind` line (earlier chatter is skipped)."""
        for line in self.proc.stdout:
            if line.startswith(f"@@{kind} "):
                return line.split()[1:]
        self.log.seek(0)
        raise RuntimeError(f"the {self.backend} step worker exited ({self.proc.wait()}) before "
                           f"'@@{kind}':\n{self.log.read()[-4000:]}")

    def wait_ready(self) -> None:
        for _ in self.names:
            name, seconds, policy, *kernels = self.expect("built")
            print(f"built and warmed up {name} in {float(seconds):.1f}s ({self.backend} worker, "
                  f"{', '.join([policy, *kernels])})", flush=True)
        self.flops = float(self.expect("ready")[0])

    def run(self, name: str, steps: int) -> common.Timing:
        self.proc.stdin.write(f"run {name} {steps}\n")
        wall, cpu = self.expect("timing")
        return common.Timing(float(wall), float(cpu))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class RemoteRunner:
    """`StepRunner`'s interface for one configuration that a `Worker` runs."""

    def __init__(self, spec, worker: Worker):
        self.spec, self.worker = spec, worker

    def round_steps(self, steps: int) -> int:
        return self.spec.round_steps(steps)

    def run(self, steps: int) -> common.Timing:
        """One timed round in the worker; `common.interleave` records the returned Timing."""
        return self.worker.run(self.spec.name, steps)

    def flops_per_pair(self) -> float:
        return self.worker.flops


def start_workers(specs: list, batch_size: int, warmup: int,
                  threads: tuple[int, int] = (0, 0)) -> dict[str, RemoteRunner]:
    """Starts one worker per kind (`Spec.worker`) of `specs` (they build while the caller builds
    its own)."""
    by_kind: dict[str, list] = {}
    for spec in specs:
        by_kind.setdefault(spec.worker, []).append(spec)
    workers = {k: Worker(k, group, batch_size, warmup, threads) for k, group in by_kind.items()}
    return {s.name: RemoteRunner(s, workers[s.worker]) for s in specs}


def wait_ready(runners: dict[str, RemoteRunner]) -> dict[str, RemoteRunner]:
    """Waits until every worker has built and warmed up its configurations."""
    for worker in {id(r.worker): r.worker for r in runners.values()}.values():
        worker.wait_ready()
    return runners


def main() -> None:
    """The worker (module docstring): this process's backend is KERAS_BACKEND."""
    import keras

    from aetv2_tf.program.precision import onednn_state
    from benchmarks.step_runner import Spec, StepRunner, example_batch

    args = worker_parser("one Keras backend").parse_args()
    tensorflow = keras.backend.backend() == "tensorflow"
    if tensorflow:
        common.configure_threads(args)
    batch = example_batch(args.batch_size)
    kernels = f" oneDNN={onednn_state()}" if tensorflow else ""
    specs = [Spec.parse(config, int(spe)) for config, spe in zip(
        args.configs.split(","), args.steps_per_execution.split(","), strict=True)]
    serve(specs, lambda spec: StepRunner(spec, batch), args.warmup,
          lambda runner: f"{runner.spec.precision}{kernels}")


def worker_parser(kind: str) -> argparse.ArgumentParser:
    """The flags `Worker` starts a worker of ``kind`` with."""
    p = argparse.ArgumentParser(description=f"A benchmarks.step worker of {kind}.")
    p.add_argument("--configs", required=True)
    p.add_argument("--batch_size", type=int, required=True)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps_per_execution", required=True, help="One per config, comma-separated.")
    p.add_argument("--intra_op", type=int, default=0, help="TensorFlow workers: intra-op threads.")
    p.add_argument("--inter_op", type=int, default=0, help="TensorFlow workers: inter-op threads.")
    return p


def serve(specs: list, make, warmup: int, describe) -> None:
    """The worker's side of the protocol: a runner made (``make(spec)``) and warmed up for each
    spec, `@@built` with ``describe(runner)``, `@@ready`, then one timed round per `run NAME
    STEPS` line until the end of input."""
    runners = {}
    for spec in specs:
        t0 = time.perf_counter()
        runners[spec.name] = make(spec)
        runners[spec.name].run(warmup)
        print(f"@@built {spec.name} {time.perf_counter() - t0:.3f} "
              f"{describe(runners[spec.name])}", flush=True)
    print(f"@@ready {next(iter(runners.values())).flops_per_pair()}", flush=True)
    for line in sys.stdin:
        _, name, steps = line.split()
        w0, c0 = time.perf_counter(), time.process_time()
        runners[name].run(int(steps))
        print(f"@@timing {time.perf_counter() - w0} {time.process_time() - c0}", flush=True)


if __name__ == "__main__":
    main()
