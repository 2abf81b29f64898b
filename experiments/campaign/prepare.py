"""Before a leg: what travels to the device machine, checked, and the device call to make.

    python -m experiments.campaign.prepare [--seconds=480]

Makes the JPEG pack if it is not there (`experiments.campaign.pack`, ignored ``.devdata/``),
restores the device's wheels into ``.whl/`` from git (`benchmarks.device_wheels`), checks the
campaign's checkpoints (their SHA-256), adds up what the call sends exactly as the tool
does (`luggage.travelling_bytes`: the checkout's tracked and untracked-not-ignored files, plus
the carried ``.whl`` and pack; refused above `luggage.REFUSE_ABOVE`, 62 of the tool's 64 MiB)
and prints the device call. Exit 2 when something is missing or the call would not fit, with
the fix.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from benchmarks import device_wheels
from benchmarks.device_step import SETUP
from experiments.campaign import leg as legs
from experiments.campaign import luggage, pack

#: What the leg's call carries beside the checkout (both ignored there).
CARRY = [device_wheels.FOLDER, pack.PACK_FOLDER]


def device_command(seconds: float, runs: str) -> str:
    """The shell command of the device call (the tool takes at most 2,000 characters): the
    wheels' install and Keras on JAX as for every device command (`device_step.SETUP`), then
    the leg."""
    return (SETUP.format(python="python3", site="/tmp/site") + " && python3 -m "
            f"experiments.campaign.leg --out=$OUT --seconds={seconds:.0f} --runs={runs}")


def device_call(seconds: float = 480.0, runs: str = ",".join(legs.RUNS)) -> str:
    """The `run` tool call of a leg, as docs/campaign.md writes it."""
    return f'run(command="{device_command(seconds, runs)}", carry={CARRY}, timeout_s=600)'


def check(repo: pathlib.Path, pack_dir: pathlib.Path, results: pathlib.Path) -> list[str]:
    """What is wrong with the call's luggage (empty: nothing), each with its fix."""
    problems = device_wheels.restore(repo)
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
    repo = luggage.repository_root()
    pack_dir = repo / pack.PACK_FOLDER
    if not (pack_dir / pack.MANIFEST).is_file():
        try:
            manifest = pack.pack(luggage.cifar10_source(repo), pack_dir)
        except (OSError, ValueError) as e:  # missing or unreadable CIFAR-10
            print(f"error: the pack could not be made ({e}); set AETV2_CIFAR10_DIR to the "
                  "cifar-10-batches-py folder", file=sys.stderr)
            return 2
        print(f"made the pack {pack_dir}: {manifest['bytes'] / 1e6:.1f} MB")
    if problems := check(repo, pack_dir, repo / legs.RESULTS.relative_to(legs.REPO)):
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    total = luggage.travelling_bytes(repo, CARRY)
    print(f"the call sends {total / 2**20:.1f} MiB of the tool's "
          f"{luggage.TOOL_LIMIT / 2**20:.0f} MiB (the checkout's tracked and untracked-not-"
          f"ignored files, {' and '.join(CARRY)})")
    if problem := luggage.luggage_problem(total, f"the checkout, {' and '.join(CARRY)}"):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(device_call(args.seconds, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
