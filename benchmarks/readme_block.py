"""The README's Python block as written: `python -m benchmarks.readme_block`.

The block ("Use it from Python") pretrains AETv2 for 150 steps of 64 pairs, saves and reloads
the model and the encoder, scores its block-2 features with the authors' KNN beside a random
init's (5,000 vs 1,000 images) and fine-tunes a classifier. The README states what it prints on
2 CPU cores and that the pretrained encoder beats the random init by at least `--min_margin`
KNN points under TensorFlow; this benchmark runs the block unchanged (only the data path points at
`--data_dir`) in a fresh directory, in a child process of `--backend`, checks that margin
(exit 1 if it is not met) and appends the numbers, with the block's wall and CPU time, to
docs/timings.md (the one source of the times the documentation states).

`--tiny` runs the same code on 4 steps of 32 pairs and 640 vs 192 images (the margin is not
checked: 4 steps teach nothing): what the test suite runs on both backends
(tests/test_library.py), so that the block keeps running as written without the suite paying for
the 150 steps.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from benchmarks import common
from benchmarks.budget import child_cpu_seconds

README_DATA = "../shared/data/cifar10/cifar-10-batches-py"
README_STEPS = "STEPS, BATCH = 150, 64"
#: The README's promise under TensorFlow: the 150-step encoder's KNN beats a random init's by this.
MIN_MARGIN = 2.0


def readme_python_block(readme: pathlib.Path = common.REPO / "README.md") -> str:
    """The one Python block of the README's "Use it from Python" section."""
    text = readme.read_text()
    section = text[text.index("## Use it from Python"):]
    section = section[:section.index("\n## ", 4)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    if len(blocks) != 1:
        raise ValueError(f"README.md's 'Use it from Python' has {len(blocks)} Python blocks, "
                         "expected 1")
    return blocks[0]


def prepare(code: str, data_dir: str, tiny: bool) -> str:
    """The block with its data path replaced; `tiny`: 4 steps of 32 on 640 vs 192 images."""
    if README_DATA not in code or README_STEPS not in code:
        raise ValueError(f"the README's block no longer reads {README_DATA!r} or sets "
                         f"{README_STEPS!r}: update benchmarks/readme_block.py with it")
    code = code.replace(README_DATA, data_dir)
    if tiny:  # sizes that the batches divide: no partial batch to trace (or compile) again
        code = code.replace(README_STEPS, "STEPS, BATCH = 4, 32")
        code = code.replace("test_images[:1000]", "test_images[:192]")
        code = code.replace("test_labels[:1000]", "test_labels[:192]").replace("[:5000]", "[:640]")
        if code.count("[:640]") != 4 or code.count("[:192]") != 4:
            raise ValueError("the README's block slices its images differently: update "
                             "benchmarks/readme_block.py's --tiny")
    return code


def run_block(code: str, work_dir: pathlib.Path, backend: str,
              timeout: float = 1800) -> dict:
    """Runs `code` as `work_dir/block.py` under `backend`; its numbers, wall and CPU seconds.

    Raises RuntimeError with the block's stderr when it fails or prints no KNN line."""
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / "block.py").write_text(code)
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    cpu, start = child_cpu_seconds(), time.monotonic()
    proc = subprocess.run([sys.executable, "block.py"], cwd=work_dir, env=env,
                          capture_output=True, text=True, timeout=timeout)
    knn = re.search(r"KNN top-1: AETv2 ([\d.]+)%, random init ([\d.]+)%", proc.stdout)
    tuned = re.search(r"fine-tuned: ([\d.]+)%", proc.stdout)
    if proc.returncode != 0 or not knn or not tuned:
        raise RuntimeError(f"the README's block failed under {backend} (exit "
                           f"{proc.returncode}):\n{proc.stderr[-4000:]}")
    return {"backend": backend, "trained": float(knn.group(1)),
            "random_init": float(knn.group(2)), "fine_tuned": float(tuned.group(1)),
            "wall_s": time.monotonic() - start,
            "cpu_s": child_cpu_seconds() - cpu,
            "stdout": proc.stdout}


def main() -> None:
    p = common.parser(__doc__)
    p.set_defaults(output=str(common.REPO / "docs" / "timings.md"))
    p.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax"),
                   help="KERAS_BACKEND of the block's process.")
    p.add_argument("--data_dir", default=str(common.DEFAULT_CIFAR10),
                   help="The cifar-10-batches-py directory.")
    p.add_argument("--work_dir", type=pathlib.Path, default=None,
                   help="Where the block runs (its runs/python/); default: a temporary folder.")
    p.add_argument("--tiny", action="store_true",
                   help="4 steps of 32 on 640 vs 192 images; no margin check (the tests).")
    p.add_argument("--min_margin", type=float, default=MIN_MARGIN,
                   help="KNN points the pretrained encoder must gain over the random init "
                        "(TensorFlow, not --tiny).")
    args = p.parse_args()
    code = prepare(readme_python_block(), args.data_dir, args.tiny)
    load = common.load_average()
    with tempfile.TemporaryDirectory(prefix="readme-block-") as scratch:
        r = run_block(code, args.work_dir or pathlib.Path(scratch), args.backend)
    margin = r["trained"] - r["random_init"]
    checked = args.backend == "tensorflow" and not args.tiny
    verdict = ("met" if margin >= args.min_margin else "NOT MET") if checked else "not checked"
    table = common.markdown_table(
        ["backend", "size", "KNN AETv2 (%)", "KNN random init (%)", "margin", "fine-tuned (%)",
         "wall (s)", "CPU (s)"],
        [[r["backend"], "tiny" if args.tiny else "as written", f"{r['trained']:.1f}",
          f"{r['random_init']:.1f}", f"{margin:+.1f} ({verdict})", f"{r['fine_tuned']:.1f}",
          f"{r['wall_s']:.0f}", f"{r['cpu_s']:.0f}"]])
    if args.no_record:  # the table only: the recorded section's machine line imports TensorFlow
        print(table, flush=True)
    else:
        common.report("The README's Python block (benchmarks.readme_block)", table, args,
                      notes=[f"Margin required under TensorFlow: >= {args.min_margin:g} KNN "
                             "points (authors' KNN, 5,000 vs 1,000 images)."], load_before=load)
    print(json.dumps({k: v for k, v in r.items() if k != "stdout"}), flush=True)
    if checked and margin < args.min_margin:
        print(f"error: the README's block gained {margin:+.1f} KNN points over the random init, "
              f"less than the {args.min_margin:g} the README states", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
