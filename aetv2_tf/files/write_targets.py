"""`check_encoder_target`: the folder `saving.save_encoder` writes into must be new or empty, or
hold only an encoder `save_encoder` wrote (replaced only with ``overwrite=True``). A training
run's folder or a folder of other files is refused whatever the caller says.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from aetv2_tf.errors import UsageError
from aetv2_tf.files.safe_paths import read_json

SAVED_BY = "aetv2_tf.save_encoder"  # the ``saved_by`` of the record `save_encoder` writes


def check_encoder_target(directory: str, overwrite: bool, own_files: Collection[str]) -> None:
    """UsageError (nothing written) unless `directory` is new, empty, or, with `overwrite`,
    holds only `own_files` and a flags.json whose ``saved_by`` is `SAVED_BY`."""
    if not os.path.lexists(directory):
        return
    if os.path.islink(directory) or not os.path.isdir(directory):
        raise UsageError(f"save_encoder: {directory} exists and is not a folder (or is a "
                         "symbolic link); nothing was written; pass a new folder")
    entries = sorted(os.listdir(directory))
    if not entries:
        return
    try:
        saved_by = read_json(os.path.join(directory, "flags.json")).get("saved_by")
    except (OSError, ValueError, AttributeError):
        saved_by = None
    if saved_by == SAVED_BY and set(entries) <= set(own_files):
        if overwrite:
            return
        raise UsageError(f"save_encoder: {directory} holds an encoder saved before; nothing was "
                         "written; pass a new folder, or overwrite=True to replace that encoder")
    what = ("a folder of an encoder saved before and other files" if saved_by == SAVED_BY else
            "a training run's folder (its flags.json was written by the program)"
            if "flags.json" in entries else "a folder of other files")
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    raise UsageError(f"save_encoder: {directory} is {what} ({shown}); nothing was written, and "
                     "its files (a run's trained weights) are never replaced, even with "
                     "overwrite=True; pass a new folder")
