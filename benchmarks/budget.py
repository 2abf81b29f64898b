"""Quality per CPU-hour: `python -m benchmarks.budget --steps=N`.

Pretrains AETv2 (`configs/budget_aetv2.cfg`, geodesic loss) and AETv1 (`configs/budget_aetv1.cfg`,
MSE) for the same number of steps and batch size, each through the real program
(`python -m aetv2_tf.train` in a subprocess), then scores every encoder, and a random-init one
(no pretraining), with the paper's KNN protocol (`configs/cifar10_probe_knn.cfg`: the published
AETv1 code's, k = 10, Euclidean, block-2 features pooled 2x2 to 3,072 values, the whole 50,000
training images against the 10,000 test images, `--stage=probe --probe=knn`). It records each
method's KNN top-1, steps, pairs, wall time, the CPU time of its processes, and the training
pairs/s.

Everything goes under `--work_dir` (default `runs/budget`), per method in lower case: `<method>/`
(the pretraining run), `<method>_knn/` (the probe's results.json) and `<method>.log` (the
programs' output). Those are deleted first, so every invocation starts from scratch.

The real benchmark takes hours (e.g. 2,000 steps of batch 128 is about 5 epochs); try it with
tiny arguments first: `--steps=3 --knn_train_examples=500 --knn_test_examples=200`.
"""

from __future__ import annotations

import json
import pathlib
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks import common

METHODS = {  # method -> pretraining flagfile (None: random init, no pretraining)
    "AETv2": "configs/budget_aetv2.cfg",
    "AETv1": "configs/budget_aetv1.cfg",
    "random": None,
}
KNN_FLAGFILE = "configs/cifar10_probe_knn.cfg"


def child_cpu_seconds() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_program(args: list[str], log: pathlib.Path) -> tuple[str, float, float]:
    """Runs `python -m aetv2_tf.train args` from the repository root, appending its output to `log`.

    Returns (its output, wall seconds, CPU seconds). Raises with the output's tail on failure.
    """
    command = [sys.executable, "-m", "aetv2_tf.train", *args]
    cpu0, t0 = child_cpu_seconds(), time.perf_counter()
    proc = subprocess.run(command, cwd=common.REPO, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, child_cpu_seconds() - cpu0
    with open(log, "a") as f:
        f.write(f"$ {' '.join(command)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout, wall, cpu


def done_summary(output: str) -> dict[str, str]:
    """The `Done (stage): k=v, k=v. Outputs in DIR` line of the program, as {k: v}."""
    line = next(ln for ln in reversed(output.splitlines()) if ln.startswith("Done ("))
    body = line.split(": ", 1)[1].rsplit(". Outputs in ", 1)[0]
    return dict(item.split("=", 1) for item in body.split(", "))


def pretrain(flagfile: str, model_dir: pathlib.Path, args, log: pathlib.Path) -> dict:
    """One pretraining run; returns its steps, wall/CPU seconds and training pairs/s."""
    output, wall, cpu = run_program(
        [f"--flagfile={flagfile}", f"--model_dir={model_dir}", f"--train_steps={args.steps}",
         f"--batch_size={args.batch_size}", f"--data_dir={args.data_dir}", "--verbose=0",
         *args.train_flag], log)
    done = done_summary(output)
    return dict(steps=int(done["steps"]), wall=wall, cpu=cpu,
                pairs_per_s=float(done["pairs_per_sec"]), loss=done.get("loss", "-"))


def knn(pretrained: str, model_dir: pathlib.Path, args, log: pathlib.Path,
        extra: Sequence[str] = ()) -> dict:
    """The KNN probe of `pretrained` (a model_dir or "none"; `extra` probe flags, e.g. the
    `--seed` of a random init); returns top-1 and its times."""
    _, wall, cpu = run_program(
        [f"--flagfile={KNN_FLAGFILE}", f"--pretrained={pretrained}", f"--model_dir={model_dir}",
         f"--data_dir={args.data_dir}", f"--train_examples={args.knn_train_examples}",
         f"--test_examples={args.knn_test_examples}", "--verbose=0", *extra], log)
    results = json.loads((model_dir / "results.json").read_text())
    return dict(top1=float(results["test_top1"]), wall=wall, cpu=cpu,
                train_examples=results["train_examples"], test_examples=results["test_examples"])


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--steps", type=int, default=2000, help="Pretraining steps of each method.")
    p.add_argument("--batch_size", type=int, default=128, help="Pretraining batch (pairs).")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"Comma-separated subset of {', '.join(METHODS)}.")
    p.add_argument("--work_dir", type=pathlib.Path, default=common.REPO / "runs" / "budget")
    p.add_argument("--data_dir", default=str(common.DEFAULT_CIFAR10),
                   help="The cifar-10-batches-py directory.")
    p.add_argument("--knn_train_examples", type=int, default=0,
                   help="KNN training pool: the first N training images (0: all 50,000).")
    p.add_argument("--knn_test_examples", type=int, default=0,
                   help="KNN test images: the first N (0: all 10,000).")
    p.add_argument("--train_flag", action="append", default=[],
                   help="An extra flag for the pretraining runs, e.g. --train_flag=--seed=1 "
                        "(repeatable).")
    args = p.parse_args()
    methods = [m.strip() for m in args.methods.split(",")]
    unknown = set(methods) - set(METHODS)
    if unknown:
        p.error(f"unknown --methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    from aetv2_tf.program.precision import choose_precision

    precision = choose_precision("auto").policy
    load = common.load_average()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    rows, sizes = [], {}
    for method in methods:
        run_dir, knn_dir = args.work_dir / method.lower(), args.work_dir / f"{method.lower()}_knn"
        log = args.work_dir / f"{method.lower()}.log"
        for stale in (run_dir, knn_dir):
            shutil.rmtree(stale, ignore_errors=True)
        log.unlink(missing_ok=True)
        if METHODS[method] is None:
            train = dict(steps=0, wall=0.0, cpu=0.0, pairs_per_s=None, loss="-")
            probe = knn("none", knn_dir, args, log)
        else:
            train = pretrain(METHODS[method], run_dir, args, log)
            probe = knn(str(run_dir), knn_dir, args, log)
        sizes = dict(train=probe["train_examples"], test=probe["test_examples"])
        rows.append([method, train["steps"], train["steps"] * args.batch_size,
                     f"{train['wall']:.0f}", f"{train['cpu'] / 3600:.3f}",
                     "-" if train["pairs_per_s"] is None else f"{train['pairs_per_s']:.1f}",
                     train["loss"], f"{probe['top1']:.2f}", f"{probe['wall']:.0f}"])
        print(f"{method}: KNN top-1 {probe['top1']:.2f}% after {train['steps']} steps", flush=True)
    table = common.markdown_table(
        ["method", "steps", "pairs", "pretraining wall s", "pretraining CPU h", "pairs/s",
         "final loss", "KNN top-1 %", "KNN wall s"], rows)
    notes = [f"Pretraining: {args.steps} steps of batch {args.batch_size}, configs/budget_*.cfg "
             f"(fused batch norm, --mixed_precision=auto = {precision} here), extra flags "
             f"{args.train_flag or 'none'}; pairs/s from the program's own timing of model.fit.",
             f"KNN: {KNN_FLAGFILE} (the authors': k=10, Euclidean, block-2 pooled 2x2), "
             f"{sizes.get('train')} training vs "
             f"{sizes.get('test')} test images. CPU h: CPU time of the program's processes; wall "
             f"s include start-up and the encoder export.",
             f"Outputs and logs: {args.work_dir}."]
    common.report("Quality per CPU-hour (benchmarks.budget)", table, args, notes,
                  load_before=load)


if __name__ == "__main__":
    main()
