"""Outputs apart from inputs: no folder a program writes lies inside, is, or holds a folder it
reads (a ``--model_dir`` inside a folder data set's ``--data_dir`` becomes a class of the data;
a data folder inside a ``--model_dir`` is mixed with its outputs). `refuse_nested` refuses each
pair before anything is read or written. Paths are compared resolved (`os.path.realpath`), so
a link cannot hide a nesting; a path that does not exist yet is compared as it will be made.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from aetv2_tf.errors import UsageError


def resolved(path: str | os.PathLike) -> str:
    """`path` with ``~`` expanded and every link, ``.`` and ``..`` resolved (absolute)."""
    return os.path.realpath(os.path.expanduser(os.fspath(path)))


def inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether `path` is `folder` or lies below it (both resolved)."""
    path, folder = resolved(path), resolved(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _named(label: str, path: str) -> str:
    """``--model_dir=runs/x`` for a flag, ``the run folder runs/x`` for any other label."""
    return f"{label}={path}" if label.startswith("--") else f"{label} {path}"


def refuse_nested(outputs: Mapping[str, str | None] | Iterable[tuple[str, str | None]],
                  inputs: Mapping[str, str | None] | Iterable[tuple[str, str | None]], *,
                  within: Mapping[str, str] | None = None) -> None:
    """UsageError when an output path (``{label: path}`` or ``(label, path)`` pairs) is, lies
    inside or holds an input path; None or empty paths are skipped. ``within``: ``{input label:
    folder}``, the one place inside that input where an output may lie."""
    within = within or {}
    outputs = list(outputs.items() if isinstance(outputs, Mapping) else outputs)
    inputs = list(inputs.items() if isinstance(inputs, Mapping) else inputs)
    for out_label, output in outputs:
        for in_label, source in inputs:
            if not output or not source:
                continue
            allowed = within.get(in_label)
            if inside(output, source) and not (allowed and inside(output, allowed) and
                                               resolved(output) != resolved(allowed)):
                where = "is" if resolved(output) == resolved(source) else "lies inside"
                raise UsageError(
                    f"{_named(out_label, output)} {where} {_named(in_label, source)}, which is "
                    "read: what is written there would be read back with it (in a folder data "
                    "set, as a class of its own), and every later run refused; nothing was "
                    f"written; choose another {out_label}, outside {in_label} (e.g. a new "
                    "folder beside it).")
            if inside(source, output):
                raise UsageError(
                    f"{_named(out_label, output)} holds {_named(in_label, source)}, which is "
                    "read: the outputs would be mixed with it (and --overwrite would move it "
                    f"aside); nothing was written; choose another {out_label}, a folder that "
                    f"does not hold {in_label}.")
