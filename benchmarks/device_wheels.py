"""The wheels a device command installs first (`device_step.SETUP`): Keras and what it needs beyond
the device's own packages (the device has Python 3.12, JAX, NumPy, h5py, absl-py, rich,
ml-dtypes and Pillow; not Keras, namex, optree), restored into the ignored ``.whl/`` from this
repository's git history, where they were committed once (2026-11-26), each checked by SHA-256.

    python -m benchmarks.device_wheels        # restores what is missing; exit 2 with the fix

No download: a machine of this project reaches no package index (``pip download`` hangs, then
fails). A file in ``.whl/`` under one of these names whose SHA-256 differs, any other file
there (the device installs ``.whl/*.whl``), or a ``.whl`` that is a link or a file, is reported
and left as it is, never replaced or written through.
"""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

from aetv2_tf.files.safe_paths import write_atomically
from benchmarks.common import REPO

FOLDER = ".whl"
#: name -> (git blob, SHA-256) of each wheel, as committed in ``.whl/`` before commit 160a375
#: (Keras's and namex's digests are those of the PyPI files).
WHEELS = {
    "keras-3.15.1-py3-none-any.whl": (
        "f5ec68597d644543b8858111d2d79ea312e139d9",
        "836460e480930acbd19bb7a17e62f9ecad40e8a9af9a651fc8d0586a96d27e20"),
    "namex-0.1.0-py3-none-any.whl": (
        "ab96872d7702cc063a658802c4a8c1150ef680a8",
        "e2012a474502f1e2251267062aae3114611f07df4224b6e06334c57b0f2ce87c"),
    "optree-0.20.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl": (
        "a69978d89de3aa79472d85ae47cb9ecc085ab6d7",
        "5c4ed341ea1ee7eb04eff01527b88a868cb19aac672a667e0aefadf7d14c0260"),
}


def restore(checkout: pathlib.Path = REPO, history: pathlib.Path | None = None) -> list[str]:
    """Writes each missing wheel of `WHEELS` into ``checkout/.whl/`` from the git history of
    ``history`` (None: the checkout's); returns what is wrong (empty: every wheel is there and
    checked), each with its fix."""
    repo = history or checkout
    folder, problems = checkout / FOLDER, []
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        return [f"{folder} is a symbolic link or not a folder; nothing was written through it: "
                "move it away and run python -m benchmarks.device_wheels"]
    for name, (blob, digest) in WHEELS.items():
        path = folder / name
        if path.is_symlink() or path.exists():
            if path.is_symlink() or not path.is_file() or \
                    hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                problems.append(f"{path} is not the wheel this project ran on the device (its "
                                f"SHA-256 is not {digest}, or it is not a file); it is left as "
                                "it is: move it away and run python -m benchmarks.device_wheels")
            continue
        proc = subprocess.run(["git", "-C", str(repo), "cat-file", "blob", blob],
                              capture_output=True)
        if proc.returncode or hashlib.sha256(proc.stdout).hexdigest() != digest:
            why = proc.stderr.decode(errors="replace").strip() or "its SHA-256 differs"
            problems.append(f"{name}: git blob {blob} of {repo} cannot be read ({why}); use a "
                            "clone with its history (`git fetch --unshallow` completes one)")
            continue
        folder.mkdir(exist_ok=True)
        write_atomically(path, proc.stdout)
    if others := sorted(set(p.name for p in folder.iterdir()) - set(WHEELS)) \
            if folder.is_dir() else []:
        problems.append(f"{folder} holds {', '.join(others)}, none of the device's wheels "
                        "(all of the folder travels, and the device installs .whl/*.whl); move "
                        "them out of it")
    return problems


def main() -> int:
    problems = restore()
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(f"{REPO / FOLDER}: {', '.join(WHEELS)} (checked)")
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
