"""The README's first command as written, timed: `python -m benchmarks.quickstart`.

Runs ``python -m aetv2_tf.train --flagfile=configs/quickstart.cfg`` in a fresh ``--model_dir``
(a temporary folder) and appends to docs/timings.md (``--output``) a dated section with the
machine, the load, and what the README promises of it: the steps its 150-s budget bought here,
the pairs per second, the quick KNN's gain over the random init, and the whole command's wall
and CPU time (the set-up's install not included). docs/timings.md is the one source of the
times the documentation states; `benchmarks.readme_block` writes its rows there too.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time

from benchmarks import common
from benchmarks.budget import child_cpu_seconds

TIMINGS = common.REPO / "docs" / "timings.md"


def parse(output: str) -> dict:
    """The quickstart's numbers from its console: budget steps and pairs/s, quick KNN."""
    budget = re.search(r"Time budget --train_seconds=([\d.]+): ([\d.]+) pairs/s measured here "
                       r"-> --train_steps=(\d+)", output)
    knn = re.search(r"Quick KNN .*?: ([\d.]+)% trained vs ([\d.]+)% random init \(([+-][\d.]+) "
                    r"points, (\d+) s\)", output)
    if not budget or not knn:
        raise ValueError("the quickstart printed no budget or no quick KNN line:\n"
                         + output[-3000:])
    return {"train_seconds": float(budget.group(1)), "pairs_per_sec": float(budget.group(2)),
            "steps": int(budget.group(3)), "knn": float(knn.group(1)),
            "random": float(knn.group(2)), "gain": float(knn.group(3)),
            "knn_seconds": int(knn.group(4))}


def main() -> None:
    p = common.parser(__doc__)
    p.set_defaults(output=str(TIMINGS))
    p.add_argument("--flag", action="append", default=[],
                   help="an extra training flag (a shorter check: --flag=--train_seconds=20)")
    args = p.parse_args()
    load = common.load_average()
    with tempfile.TemporaryDirectory(prefix="quickstart-") as scratch:
        command = [sys.executable, "-m", "aetv2_tf.train", "--flagfile=configs/quickstart.cfg",
                   f"--model_dir={scratch}/quickstart", *args.flag]
        cpu, start = child_cpu_seconds(), time.monotonic()
        proc = subprocess.run(command, cwd=common.REPO, capture_output=True, text=True)
        wall, cpu = time.monotonic() - start, child_cpu_seconds() - cpu
    if proc.returncode:
        sys.exit(f"the quickstart failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    r = parse(proc.stdout)
    table = common.markdown_table(
        ["budget", "steps bought", "pairs/s", "quick KNN", "random init", "gain", "KNN (s)",
         "whole command wall", "CPU"],
        [[f"{r['train_seconds']:g} s", r["steps"], f"{r['pairs_per_sec']:.0f}",
          f"{r['knn']:.2f}%", f"{r['random']:.2f}%", f"{r['gain']:+.2f}", r["knn_seconds"],
          f"{wall:.0f} s ({wall / 60:.1f} min)", f"{cpu:.0f} s"]])
    common.report("The quickstart (benchmarks.quickstart)", table, args, load_before=load,
                  notes=["`python -m aetv2_tf.train --flagfile=configs/quickstart.cfg` in a "
                         "fresh --model_dir" + (f", with {' '.join(args.flag)}" if args.flag
                                                else "")])


if __name__ == "__main__":
    main()
