"""One row of the research table: pretrain a variant, score it with KNN, print the row.

    python -m experiments.loss_screen.screen --name=v1_b1 --flagfile=configs/budget_aetv1.cfg \
        --steps=390 --train_flag=--warmup_steps=40

runs `python -m aetv2_tf.train --flagfile=F --model_dir=runs/screen/NAME --train_steps=STEPS
[train flags]` and then the KNN probe (`configs/cifar10_probe_knn.cfg`: the published AETv1
code's KNN, k = 10, Euclidean, block 2 pooled 2x2 to 3,072 values, float32, 50,000 training vs
10,000 test images) on its newest checkpoint.
`--flagfile=none` scores a random-init encoder instead (its `--train_flag`s go to the probe,
e.g. `--train_flag=--seed=1` for another init). The markdown row
(name, the exact pretraining command, steps x batch, wall times, final loss, the held-out
accuracy of each quarter turn k = 0/1/2/3 (`experiments.loss_screen.pretext_eval`), KNN top-1) is
printed and appended to `runs/screen/rows.md`; docs/reproduction.md collects those rows.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import shutil
import subprocess
import sys

from benchmarks import common
from benchmarks.budget import done_summary, knn, run_program


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="Run name: runs/screen/<name>.")
    p.add_argument("--flagfile", required=True, help="Pretraining flagfile, or 'none'.")
    p.add_argument("--steps", type=int, default=390, help="Pretraining steps.")
    p.add_argument("--train_flag", action="append", default=[],
                   help="An extra pretraining flag, e.g. --train_flag=--seed=1 (repeatable).")
    p.add_argument("--work_dir", type=pathlib.Path, default=common.REPO / "runs" / "screen")
    p.add_argument("--data_dir", default=str(common.DEFAULT_CIFAR10),
                   help="CIFAR-10 of the KNN and the diagnostics (and of pretraining, unless "
                        "--train_data_dir).")
    p.add_argument("--train_data_dir", default=None,
                   help="Pretrain on this cifar-10-batches-py folder instead of --data_dir "
                        "(e.g. an unpacked experiments.campaign.pack); scored on --data_dir.")
    p.add_argument("--knn_train_examples", type=int, default=0)
    p.add_argument("--knn_test_examples", type=int, default=0)
    args = p.parse_args()
    run_dir, knn_dir = args.work_dir / args.name, args.work_dir / f"{args.name}_knn"
    log = args.work_dir / f"{args.name}.log"
    for stale in (run_dir, knn_dir):
        shutil.rmtree(stale, ignore_errors=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    if args.flagfile == "none":
        command = " ".join(["(random init)", *args.train_flag])
        train = dict(wall=0.0, loss="-", steps=0, batch="-")
        probe = knn("none", knn_dir, args, log, args.train_flag)
    else:
        flags = [f"--flagfile={args.flagfile}", f"--model_dir={run_dir}",
                 f"--train_steps={args.steps}", *args.train_flag]
        train_data = args.train_data_dir or args.data_dir
        output, wall, _ = run_program([*flags, f"--data_dir={train_data}", "--verbose=0"], log)
        done = done_summary(output)
        shown = [*flags, f"--data_dir={args.train_data_dir}"] if args.train_data_dir else flags
        command = "python -m aetv2_tf.train " + " ".join(shlex.quote(f) for f in shown)
        batch = next((f.split("=")[1] for f in reversed(args.train_flag)
                      if f.startswith("--batch_size=")), "cfg")
        train = dict(wall=wall, loss=done.get("loss", "-"), steps=done["steps"], batch=batch)
        probe = knn(str(run_dir), knn_dir, args, log)
    rotations = "-"
    if args.flagfile != "none":
        proc = subprocess.run([sys.executable, "-m", "experiments.loss_screen.pretext_eval",
                               str(run_dir), f"--data_dir={args.data_dir}"], cwd=common.REPO,
                              capture_output=True, text=True, check=True)
        held_out = json.loads(proc.stdout.strip().splitlines()[-1])
        rotations = " / ".join(f"{held_out[f'k{k}']['accuracy']:.2f}" for k in range(4))
    row = (f"| {args.name} | `{command}` | {train['steps']} x {train['batch']} | "
           f"{train['wall']:.0f} s | {train['loss']} | {rotations} | {probe['top1']:.2f} | "
           f"{probe['wall']:.0f} s |")
    print(row, flush=True)
    with open(args.work_dir / "rows.md", "a") as f:
        f.write(row + "\n")


if __name__ == "__main__":
    main()
