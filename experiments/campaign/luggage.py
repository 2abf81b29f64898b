"""What a device call carries, counted as the device tool counts it, and where CIFAR-10 is.

The device tool sends the repository's tracked files (``git ls-files``), its untracked files
that git does not ignore (``git ls-files --others --exclude-standard``), a ``shared/`` folder
inside the checkout when there is one, and every path named in the call's ``carry``: 64 MiB in
all (`TOOL_LIMIT`). `travelling_bytes` adds up exactly those files, from the repository root
that git names (`repository_root`: a script may sit anywhere in the tree); a symbolic link
travels as a link (its own size), never what it points to. `REFUSE_ABOVE` keeps 2 MiB for what
a session adds before it makes the call (a ledger row, a log).

`cifar10_source`: the official CIFAR-10 python folder that the pack and the subsets are made
from: ``$AETV2_CIFAR10_DIR``, else ``../shared/data/cifar10/cifar-10-batches-py`` beside the
checkout (for a git worktree, beside its main checkout too).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Iterable

TOOL_LIMIT = 64 * 2**20
REFUSE_ABOVE = 62 * 2**20
CIFAR10_IN_SHARED = pathlib.Path("shared") / "data" / "cifar10" / "cifar-10-batches-py"
HERE = pathlib.Path(__file__).resolve().parent


def _git(root: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True,
                          text=True).stdout


def repository_root(inside: pathlib.Path = HERE) -> pathlib.Path:
    """The top folder of the git checkout that holds ``inside`` (``git rev-parse
    --show-toplevel``)."""
    return pathlib.Path(_git(inside, "rev-parse", "--show-toplevel").strip())


def _walk(path: pathlib.Path) -> Iterable[pathlib.Path]:
    """``path`` if it is a file or a link, else every file and link below it (links to
    folders are not entered: they travel as links)."""
    if path.is_symlink() or not path.is_dir():
        yield path
        return
    for folder, dirs, files in os.walk(path, followlinks=False):
        base = pathlib.Path(folder)
        yield from (base / name for name in files)
        yield from (base / name for name in dirs if (base / name).is_symlink())


def travelling_files(root: pathlib.Path, carry: Iterable[str]) -> list[pathlib.Path]:
    """Every file a call from the checkout ``root`` sends with ``carry`` (paths relative to
    ``root``), each once, in no particular order; files git lists that are not on disk (deleted
    in the work tree) are left out."""
    listed = _git(root, "ls-files", "-z") + "\0" + _git(
        root, "ls-files", "--others", "--exclude-standard", "-z")
    found = {root / name for name in listed.split("\0") if name}
    for top in [*carry, *(["shared"] if (root / "shared").is_dir() else [])]:
        found.update(_walk(root / top))
    return [p for p in found if p.is_symlink() or p.is_file()]


def travelling_bytes(root: pathlib.Path, carry: Iterable[str]) -> int:
    """The bytes a call from ``root`` with ``carry`` sends (`travelling_files`; a link counts
    its own size)."""
    return sum(p.lstat().st_size for p in travelling_files(root, carry))


def luggage_problem(total: int, what: str) -> str | None:
    """Why a call of ``total`` bytes (``what``: the paths it carries, for the message) must not
    be made, or None when it fits under `REFUSE_ABOVE`."""
    if total <= REFUSE_ABOVE:
        return None
    return (f"the call would send {total / 2**20:.1f} MiB ({what}), more than "
            f"{REFUSE_ABOVE / 2**20:.0f} MiB of the tool's {TOOL_LIMIT / 2**20:.0f} MiB: carry "
            "less (fewer or smaller carried paths), or move large untracked files out of the "
            "checkout or into .gitignore; see docs/campaign.md, 'What travels'")


def cifar10_source(root: pathlib.Path | None = None) -> pathlib.Path:
    """The official CIFAR-10 python folder (module docstring): the first of the candidates
    that holds ``data_batch_1``, else the first candidate (for the caller's message)."""
    if os.environ.get("AETV2_CIFAR10_DIR"):
        return pathlib.Path(os.environ["AETV2_CIFAR10_DIR"])
    root = root or repository_root()
    candidates = [root.parent / CIFAR10_IN_SHARED]
    common = pathlib.Path(_git(root, "rev-parse", "--path-format=absolute",
                               "--git-common-dir").strip())
    if common.name == ".git":  # a worktree's main checkout
        candidates.append(common.parent.parent / CIFAR10_IN_SHARED)
    return next((c for c in candidates if (c / "data_batch_1").is_file()), candidates[0])
