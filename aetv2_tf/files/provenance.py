"""What this project wrote, recognised before anything is replaced, removed or run.

An export (`files.savedmodel.export_encoder`) writes ``aetv2_export.json`` beside its
``saved_model.pb``: the SHA-256 of every file of the SavedModel (relative paths with ``/``) and
the ``encoder`` record (`export_record`). A directory is "a project export" (`verify_export`
returns None) when its files are exactly those the manifest lists, each with its digest.

* Replacing an export (`check_export_target`, `replace_export`): only a project export or an
  empty folder is replaced; anything else is refused and left as it was, so no user file is
  ever deleted.
* Loading one as ``--pretrained`` (`probes.frozen_encoder`): a SavedModel is a program, so a
  project export is never run: its ``encoder`` record says which encoder this project builds,
  and ``variables/`` are read into it as data. Any other SavedModel is loaded only with
  ``--trust_saved_model``. The digest catches accidents and swapped files; it authenticates no
  author (docs/reliability.md, "Trust: what the project did not write").
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile

from absl import logging

from aetv2_tf.files.digests import file_digest
from aetv2_tf.files.safe_paths import process_alive, read_json, write_atomically

MANIFEST = "aetv2_export.json"
FORMAT = "aetv2_tf export"


class ExportTargetError(ValueError):
    """An export's output that is not ours to replace: the message names it and the fix."""


def _files(directory: str) -> list[str]:
    """Every file (and symlink) under `directory` but the manifest, relative, with "/"."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        # a symlinked folder is listed as an entry (never followed): it cannot match a digest
        entries = files + [d for d in dirs if os.path.islink(os.path.join(root, d))]
        for name in sorted(entries):
            rel = os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
            if rel != MANIFEST:
                found.append(rel)
    return found


def write_manifest(directory: str, encoder: dict | None = None) -> str:
    """Writes `directory`/aetv2_export.json: the digest of every file in it and, when given, the
    `encoder` record (`export_record`); returns its path."""
    files = {rel: file_digest(os.path.join(directory, rel)) for rel in _files(directory)}
    path = os.path.join(directory, MANIFEST)
    manifest = {"format": FORMAT, "version": 1, "sha256": files}
    if encoder is not None:
        manifest["encoder"] = encoder
    return write_atomically(path, json.dumps(manifest, indent=1, sort_keys=True))


def export_record(directory: str) -> dict | None:
    """The `encoder` record of a VERIFIED export's manifest (`verify_export` first): ``name``
    (the backbone), ``input_shape`` (H, W, 3), ``mean`` and ``std`` (the normalisation the
    signature applies) and ``shapes`` (of ``encoder.variables``, in order: the SavedModel's
    ``variables/<i>`` entries); None when the manifest has none or it is malformed."""
    try:
        record = read_json(os.path.join(directory, MANIFEST)).get("encoder")
        ok = isinstance(record, dict) and isinstance(record.get("name"), str) and all(
            isinstance(record.get(k), list) for k in ("input_shape", "mean", "std", "shapes"))
    except (OSError, ValueError, AttributeError):
        return None
    return record if ok else None


def verify_export(directory: str) -> str | None:
    """None when `directory` is a project export whose files all match its manifest (module
    docstring); else why not, in a few words."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return f"it has no {MANIFEST} (not an export of this project, or one without a manifest)"
    try:
        manifest = read_json(path)
        listed = manifest["sha256"]
        if manifest.get("format") != FORMAT or not isinstance(listed, dict):
            raise ValueError("not an export manifest")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its {MANIFEST} is unreadable ({e})"
    present = _files(directory)
    extra = sorted(set(present) - set(listed))
    if extra:
        return f"it holds files its {MANIFEST} does not list: {', '.join(extra[:5])}"
    missing = sorted(set(listed) - set(present))
    if missing:
        return f"files listed in its {MANIFEST} are missing: {', '.join(missing[:5])}"
    for rel in present:
        full = os.path.join(directory, rel)
        # a link or a FIFO (which would block the digest) is never a file that was exported
        if not stat.S_ISREG(os.lstat(full).st_mode) or file_digest(full) != listed[rel]:
            return f"{rel} is not the file that was exported (its SHA-256 differs from {MANIFEST})"
    return None


def _is_same_or_ancestor(path: str, other: str) -> bool:
    """`path` is `other` or a folder above it (both resolved)."""
    return other == path or other.startswith(path.rstrip(os.sep) + os.sep)


#: The files of a SavedModel export without a manifest (and the prefix of its variable shards,
#: `variables/variables.data-00000-of-00001`: one path component).
_SAVED_MODEL_FILES = ("saved_model.pb", "fingerprint.pb", "keras_metadata.pb",
                      "variables/variables.index")
_SHARD_PREFIX = "variables/variables.data-"


def _run_export_without_manifest(directory: str) -> bool:
    """`directory` is `<run>/export/encoder` of a run (`<run>/flags.json`) holding only the
    files of a SavedModel, without a manifest: the run's own export may replace it."""
    real = os.path.realpath(directory)
    export_dir = os.path.dirname(real)
    if (os.path.basename(real), os.path.basename(export_dir)) != ("encoder", "export") or \
            not os.path.isfile(os.path.join(os.path.dirname(export_dir), "flags.json")):
        return False
    return _only_saved_model_files(directory)


def _only_saved_model_files(directory: str) -> bool:
    """`directory` holds only the files a SavedModel export writes (nothing deeper)."""
    files = _files(directory)
    return "saved_model.pb" in files and all(
        rel in _SAVED_MODEL_FILES or (rel.startswith(_SHARD_PREFIX) and
                                      "/" not in rel[len(_SHARD_PREFIX):])
        for rel in files)


def check_export_target(output: str) -> None:
    """ExportTargetError (nothing touched) for an `output` an export must not replace: the
    working directory or a folder above it, the home folder, a file, a model_dir (flags.json),
    or a non-empty directory that is neither a project export (`verify_export`) nor the
    manifest-less SavedModel at a run's `export/encoder`."""
    real = os.path.realpath(output)
    fix = "choose a new or empty --output, or a previous export of this project"
    protected = {os.path.realpath(os.getcwd()): "the working directory",
                 os.path.realpath(os.path.expanduser("~")): "the home folder"}
    for place, name in protected.items():
        if _is_same_or_ancestor(real, place):
            raise ExportTargetError(f"--output={output} is {name} or a folder above it; an export "
                                    f"replaces its output directory, so {fix}.")
    if not os.path.lexists(output):
        return
    if os.path.islink(output) or not os.path.isdir(output):
        raise ExportTargetError(f"--output={output} exists and is not a directory; {fix}.")
    if os.path.exists(os.path.join(output, "flags.json")):
        raise ExportTargetError(f"--output={output} is a run's --model_dir (it holds flags.json);"
                                f" nothing was changed; {fix} (by default MODEL_DIR/export/"
                                "encoder).")
    if not os.listdir(output):
        return
    why = verify_export(output)
    if why is not None and not _run_export_without_manifest(output):
        raise ExportTargetError(f"--output={output} is a non-empty directory that is not an "
                                f"export of this project ({why}); nothing was changed. An export "
                                f"replaces its output directory, so {fix}.")


def remove_dead_scratch(parent: str, name: str) -> list[str]:
    """Removes and returns the scratch folders ``.<name>.tmp<pid>-*`` in `parent` of exports
    killed mid-write (`replace_export`; pid not running), when they hold only ``new`` and an
    ``old`` that is ours (`verify_export`); other content, links and live folders stay."""
    prefix, removed = f".{name}.tmp", []
    for entry in os.listdir(parent):
        pid = entry[len(prefix):].partition("-")[0]
        path = os.path.join(parent, entry)
        if not entry.startswith(prefix) or not pid.isdigit() or process_alive(int(pid)) or \
                os.path.islink(path) or not os.path.isdir(path):
            continue
        parts = os.listdir(path)
        old = os.path.join(path, "old")
        if set(parts) <= {"new", "old"} and not any(
                os.path.islink(os.path.join(path, p)) for p in parts) and (
                "old" not in parts or not os.listdir(old) or verify_export(old) is None or
                _only_saved_model_files(old)):
            shutil.rmtree(path)
            removed.append(path)
            logging.info("Removed %s, the scratch folder of an export killed mid-write.", path)
    return removed


def replace_export(write, output: str, encoder: dict | None = None) -> str:
    """`write(tmp)` fills a new directory beside `output`, then its manifest is written; an
    existing `output` (`check_export_target`) is moved aside, the new one renamed into place,
    and the old one removed only once verified again as ours. The scratch folder is named by
    this process's pid (`remove_dead_scratch`). Returns `output`."""
    check_export_target(output)
    output = os.path.abspath(output)
    parent, name = os.path.split(output)
    os.makedirs(parent, exist_ok=True)
    remove_dead_scratch(parent, name)
    scratch = tempfile.mkdtemp(prefix=f".{name}.tmp{os.getpid()}-", dir=parent)
    try:
        staged = os.path.join(scratch, "new")
        write(staged)
        write_manifest(staged, encoder)
        if os.path.lexists(output):
            check_export_target(output)  # again: it may have changed while we wrote
            aside = os.path.join(scratch, "old")
            os.replace(output, aside)
            os.replace(staged, output)
            if os.listdir(aside) and verify_export(aside) is not None and \
                    not _only_saved_model_files(aside):
                # changed between the check and the move: the new export stands, the old
                # folder is kept beside it, untouched, and named
                kept = f"{output}.kept-{os.getpid()}"
                os.replace(aside, kept)
                logging.warning("The previous %s changed during the export: the new export is "
                                "in place, the old folder was kept as %s, untouched.", output,
                                kept)
        else:
            os.replace(staged, output)
    finally:
        # holds only what this call wrote (new) and a verified export of ours (old)
        shutil.rmtree(scratch, ignore_errors=True)
    return output
