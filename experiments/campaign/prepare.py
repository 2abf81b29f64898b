"""Before a leg: what travels to the device machine, checked, and the device call to make.

    python -m experiments.campaign.prepare [--seconds=480]

Makes the JPEG pack if it is not there (`experiments.campaign.pack`, ignored ``.devdata/``),
checks the wheels of ``.whl/`` (Keras and what it needs beyond the device's own packages: the
device has JAX, NumPy, h5py, absl-py, rich, ml-dtypes, Pillow; not Keras, namex, optree) and
the campaign's checkpoints (their SHA-256), adds up what the call sends (the tracked and
untracked-not-ignored files, plus the carried ``.whl`` and pack: at most 64 MiB) and prints the
device call. Exit 2 when something is missing or the call would not fit, with the fix.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from experiments.campaign import leg as legs
from experiments.campaign import pack
from experiments.scale.make_devdata import travelling_bytes

LIMIT = 64 * 2**20
MARGIN = 2 * 2**20  # room for the results a session adds before the call
WHEELS = ("keras-3.15.1-", "namex-", "optree-")
WHEEL_HELP = (
    "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 "
    "--implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 "
    "--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl keras==3.15.1 "
    "namex optree")


def device_command(seconds: float, runs: str) -> str:
    """The shell command of the device call (the tool takes at most 2,000 characters)."""
    return ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
            "--upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD "
            "KERAS_BACKEND=jax PYTHONUNBUFFERED=1 && python3 -m experiments.campaign.leg "
            f"--out=$OUT --seconds={seconds:.0f} --runs={runs}")


def check(repo: pathlib.Path, pack_dir: pathlib.Path, results: pathlib.Path) -> list[str]:
    """What is wrong with the call's luggage (empty: nothing), each with its fix."""
    problems = []
    wheels = sorted(p.name for p in (repo / ".whl").glob("*.whl"))
    for prefix in WHEELS:
        if not any(w.startswith(prefix) for w in wheels):
            problems.append(f".whl/ has no {prefix}*.whl; fetch the wheels: {WHEEL_HELP}")
    try:
        pack.read_manifest(pack_dir)
    except pack.PackError as e:
        problems.append(str(e))
    for run in legs.RUNS:
        try:
            legs.checked_checkpoint(results / run)
        except ValueError as e:
            problems.append(str(e))
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=480.0,
                   help="the leg's length (the device tool's 600 s less the set-up and margin)")
    p.add_argument("--runs", default=",".join(legs.RUNS))
    args = p.parse_args(argv)
    repo, pack_dir = legs.REPO, pack.DEFAULT_PACK
    if not (pack_dir / pack.MANIFEST).is_file():
        manifest = pack.pack(pack.SOURCE, pack_dir)
        print(f"made the pack {pack_dir}: {manifest['bytes'] / 1e6:.1f} MB")
    if problems := check(repo, pack_dir, legs.RESULTS):
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    carried = [repo / ".whl", pack_dir]
    total = travelling_bytes(carried)
    print(f"the call sends {total / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB (the repository, "
          f".whl/ and {pack_dir.relative_to(repo)})")
    if total > LIMIT - MARGIN:
        print(f"error: that leaves less than {MARGIN / 2**20:.0f} MiB: the call would not fit; "
              "see docs/campaign.md, 'What travels'", file=sys.stderr)
        return 2
    carry = [".whl", str(pack_dir.relative_to(repo))]
    print(f'run(command="{device_command(args.seconds, args.runs)}", carry={carry}, '
          "timeout_s=600)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
