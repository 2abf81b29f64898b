"""The model directory: checked before any work starts, flags written beside the checkpoints.

Layout of a `--model_dir`:

    flags.cfg          this run's flags, reusable as --flagfile (command line included)
    flags.json         the same, machine-readable (compared when a run resumes)
    checkpoints/       ckpt-<step>.weights.h5 (Keras, atomic; every backend)
    train/             TensorBoard event files (and log.csv on backends other than TensorFlow)
    encoder.weights.h5 the encoder alone, read by every backend (end of training)
    aet_model.keras    the whole pretext model (end of training, TensorFlow)
    export/encoder/    SavedModel of the encoder for feature extraction (end of training),
                       with aetv2_export.json (`aetv2_tf.files.provenance`)
    overwritten-<time>/  a previous run, set aside by --overwrite (nothing is deleted)

A run whose checkpoints/ holds only `tf.train.Checkpoint` files (ckpt-<step>.{index,data-*},
checkpoint: aetv2_tf 0.1) is refused, naming the version that resumes it
(`pretext_stage.check_resumable`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from aetv2_tf.errors import UsageError  # the library's (`rundir.UsageError` is the same class)
from aetv2_tf.files.nesting import refuse_nested
from aetv2_tf.files.safe_paths import (
    open_for_writing,
    read_json,
    read_regular_file,
    write_atomically,
)
from aetv2_tf.program.run_lock import LOCK_NAME, lock
from aetv2_tf.program.run_lock import PART_FIX as _PART_FIX

MIN_FREE_BYTES = 64 * 2**20


def check_writable(model_dir: str, min_free_bytes: int = MIN_FREE_BYTES) -> None:
    """Fails now, not after an hour, when `model_dir` cannot hold checkpoints.

    A `model_dir` that this check creates is removed again when the check fails.
    """
    created = not os.path.isdir(model_dir)
    try:
        os.makedirs(model_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write_test_") as f:
            f.write(b"x" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        _remove_if_created(model_dir, created)
        raise UsageError(f"--model_dir={model_dir} is not writable ({e.strerror}); choose a "
                         "directory you can write to.") from e
    try:
        check_free_space(model_dir, min_free_bytes)
    except UsageError:
        _remove_if_created(model_dir, created)
        raise


def check_free_space(model_dir: str, needed_bytes: int, what: str = "checkpoints") -> None:
    """UsageError naming the shortfall when `model_dir`'s disk has less than `needed_bytes`."""
    free = shutil.disk_usage(model_dir).free
    if free < needed_bytes:
        raise UsageError(f"--model_dir={model_dir} has only {free / 2**20:.1f} MiB free; "
                         f"{what} need at least {needed_bytes / 2**20:.0f} MiB. Free some "
                         "space, lower --keep_checkpoints, or choose another --model_dir.")


def _remove_if_created(model_dir: str, created: bool) -> None:
    if created:
        try:
            os.rmdir(model_dir)
        except OSError:
            pass


def check_apart(model_dir: str, data_dir: str | None, pretrained: str | None) -> None:
    """UsageError, before any data is read or anything written, when `model_dir` is, lies
    inside or holds `data_dir` or a `pretrained` run (`files.nesting.refuse_nested`)."""
    if pretrained and pretrained.strip().lower() == "none":
        pretrained = None
    refuse_nested({"--model_dir": model_dir}, {"--data_dir": data_dir, "--pretrained": pretrained})


HISTORY = "flags_history.jsonl"


def _trained_step(model_dir: str) -> int:
    """The step of the run's newest checkpoint (0: nothing trained yet)."""
    from aetv2_tf.program.keras_checkpoints import list_checkpoints

    found = list_checkpoints(os.path.join(model_dir, "checkpoints"))
    return found[-1][0] if found else 0


def _effective_flags(model_dir: str, saved: dict) -> dict:
    """The first record (`flags.json`) with every accepted change (`flags_history.jsonl`)."""
    flags = dict(saved)
    path = os.path.join(model_dir, HISTORY)
    if os.path.exists(path):
        for line in read_regular_file(path).decode("utf-8").splitlines():
            flags.update({k: new for k, (_, new) in json.loads(line)["changed"].items()})
    return flags


def _trajectory_changes(model_dir: str, saved: dict, run_flags: dict,
                        trajectory: tuple[str, ...]) -> tuple[int, dict]:
    """`(step, {flag: (value until now, value asked)})` of a resumed run's `trajectory` flags
    that differ from the run's (its first record and accepted changes); `(step, {})` when
    nothing differs or nothing has trained yet (a probe's step: its epoch)."""
    step = _trained_step(model_dir)
    if not step:
        return step, {}
    before = _effective_flags(model_dir, saved)
    return step, {k: (before[k], run_flags.get(k)) for k in trajectory
                  if k in before and before[k] != run_flags.get(k)}


#: What a run writes at the top of its model_dir (files and folders), set aside by --overwrite.
RUN_ENTRIES = ("checkpoints", "train", "validation", "test", "probe", "export", ".worker_tmp",
               "aet_model.keras", "aet_model.keras.sha256", "encoder.weights.h5",
               "encoder.weights.h5.sha256", "results.json", "budget.json", "epochs.csv",
               "best.weights.h5", "best.weights.h5.sha256", HISTORY, "flags.json", "flags.cfg")
#: The names a run writes inside its folders (fnmatch patterns on the file's base name); any
#: other file there is not the project's (e.g. the images of a folder dataset's train/).
RUN_FILES = {
    "checkpoints": ("ckpt-*", "checkpoint", ".tmp*", "*.sha256", "*.bad"),
    "train": ("events.out.tfevents.*", "log.csv", "*.profile-empty", "*.pb", "*.trace.json.gz"),
    "validation": ("events.out.tfevents.*",), "test": ("events.out.tfevents.*",),
    "probe": ("events.out.tfevents.*", "*.csv", "*.json", "*.weights.h5"),
    "export": ("saved_model.pb", "fingerprint.pb", "keras_metadata.pb", "aetv2_export.json",
               "variables.index", "variables.data-*", ".tmp*"),
    ".worker_tmp": ("ckpt-*", ".tmp*", "*.sha256", "*.bad"),
}


def foreign_files(model_dir: str, limit: int = 5) -> list[str]:
    """Up to `limit` paths under the run's folders of `model_dir` (`RUN_FILES`) that no run
    writes: names outside the folder's patterns (e.g. a folder dataset's images in train/ and
    test/) and symbolic links of any name (a run writes none). A model_dir there is refused
    rather than mixed with them or set aside with them. Stops at `limit` (a dataset's millions
    of files are not listed); links are never followed."""
    import fnmatch

    found: list[str] = []
    for folder, patterns in RUN_FILES.items():
        top = os.path.join(model_dir, folder)
        if os.path.islink(top) or not os.path.isdir(top):
            continue  # a link is refused by `linked_parts`; a file makes the write fail
        for root, dirs, files in os.walk(top):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                path = os.path.join(root, name)
                if os.path.islink(path) or not any(fnmatch.fnmatch(name, p) for p in patterns):
                    found.append(path)
                    if len(found) >= limit:
                        return found
    return found


def linked_parts(model_dir: str) -> list[str]:
    """The parts of `model_dir` that the program writes, moves or takes (`RUN_ENTRIES` and the
    lock) that are symbolic links, each as ``path -> target``."""
    found = []
    for name in (*RUN_ENTRIES, LOCK_NAME):
        path = os.path.join(model_dir, name)
        if os.path.islink(path):
            found.append(f"{path} -> {os.readlink(path)}")
    return found


def check_run_parts(model_dir: str) -> None:
    """UsageError, before anything is written, when `model_dir` holds what a run must not
    write into, move or adopt: a part of the run (`linked_parts`: the lock, checkpoints/,
    train/, export/, encoder.weights.h5, results.json, ...) that is a symbolic link; files no
    run writes, or links, in the run's folders (`foreign_files`); or a run's outputs
    (`run_outputs`: checkpoints, weights, an export, results) without the run's own record,
    flags.json, which every start of this program writes first: they are another program's or
    a user's files, never resumed from, pruned or replaced."""
    linked = linked_parts(model_dir)
    if linked:
        raise UsageError(f"--model_dir={model_dir} has parts of a run that are symbolic links "
                         f"({', '.join(linked)}); nothing was written; {_PART_FIX}.")
    found = foreign_files(model_dir)
    if found:
        raise UsageError(f"--model_dir={model_dir} holds files this project did not write where "
                         f"a run writes ({', '.join(found)}{', ...' if len(found) >= 5 else ''})"
                         "; is it a dataset's folder? Nothing was changed; choose a new, empty "
                         "--model_dir.")
    held = run_outputs(model_dir)
    if held and not os.path.lexists(os.path.join(model_dir, "flags.json")):
        raise UsageError(f"--model_dir={model_dir} holds run outputs ({', '.join(held)}) but no "
                         "flags.json, the record every run of this program writes first: they "
                         "are not this program's run, so they are neither resumed nor replaced; "
                         "nothing was changed. Move them away, restore the run's flags.json "
                         "(from a backup), or choose a new, empty --model_dir.")


def _set_aside_run(model_dir: str, why: str = "--overwrite") -> str:
    """What `--overwrite` does: moves the previous run's entries (`RUN_ENTRIES`) into a new
    `<model_dir>/overwritten-<time>/` and returns its path.

    Moving aside rather than deleting: nothing is ever lost by a mistyped --model_dir or a
    misunderstood flag (a run read by another one, a dataset folder), and it costs no time (one
    rename per entry, on the same disk); the user deletes the folder when it is not needed. Only
    names that runs write are moved, and `prepare` has refused a model_dir whose run folders hold
    other files (`check_run_parts`); anything else in the model_dir stays where it is.
    """
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = os.path.join(model_dir, f"overwritten-{stamp}")
    n = 1
    while os.path.lexists(aside):
        n += 1
        aside = os.path.join(model_dir, f"overwritten-{stamp}-{n}")
    os.makedirs(aside)
    for name in RUN_ENTRIES:
        path = os.path.join(model_dir, name)
        if os.path.lexists(path):
            os.replace(path, os.path.join(aside, name))
    print(f"{why}: the previous run in {model_dir} was moved to {aside} (delete it when you no "
          "longer need it).", flush=True)
    return aside


#: What shows that a run trained or produced something (besides its flags and logs).
RESULTS = ("checkpoints", "encoder.weights.h5", "aet_model.keras", "export", "results.json",
           "best.weights.h5", "epochs.csv", "probe", HISTORY)


def holds_results(model_dir: str) -> bool:
    """Whether the run in `model_dir` trained or wrote a result (`RESULTS`; an empty
    checkpoints/ does not count): such a run is never replaced without --overwrite."""
    for name in RESULTS:
        path = os.path.join(model_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            if os.listdir(path):
                return True
        elif os.path.lexists(path):
            return True
    return False


def run_outputs(model_dir: str) -> list[str]:
    """The names of `RESULTS` in `model_dir` that are what a run writes there: a non-empty
    folder (checkpoints/, export/, probe/) or a regular file (encoder.weights.h5, ...); a file
    where a folder goes is not one (the write fails there, and says so)."""
    found = []
    for name in RESULTS:
        path = os.path.join(model_dir, name)
        if name in RUN_FILES:
            if os.path.isdir(path) and os.listdir(path):
                found.append(name)
        elif os.path.isfile(path):
            found.append(name)
    return found


def read_flags_record(path: str, run_flags: dict | None = None) -> dict:
    """The run record `path` (a flags.json), checked: a JSON object whose values have the
    types of `run_flags`' (a string where a string is expected, ...); else a UsageError naming
    the file and the fix."""
    fix = ("move it away (or restore it from a backup), or choose another --model_dir; a "
           "folder holding a run of this project has the flags.json its first start wrote")
    try:
        saved = read_json(path, fix)
    except UsageError:  # not a regular file, too large: named with the fix
        raise
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} is not a readable JSON record of a run ({e}); {fix}.") from e
    if not isinstance(saved, dict):
        raise UsageError(f"{path} holds a JSON {type(saved).__name__}, not the object of flags "
                         f"a run writes; {fix}.")
    for key, value in (run_flags or {}).items():
        got = saved.get(key)
        if got is None or value is None:
            continue
        kinds = (int, float) if isinstance(value, (int, float)) and not isinstance(
            value, bool) else type(value)
        if not isinstance(got, kinds) or (isinstance(got, bool) != isinstance(value, bool)):
            raise UsageError(f"{path}: --{key} is {json.dumps(got)[:60]}, not a "
                             f"{type(value).__name__} as a run writes it; {fix}.")
    return saved


def prepare(model_dir: str, run_flags: dict, flagfile: str, essential: tuple[str, ...],
            overwrite: bool, chief: bool = True, trajectory: tuple[str, ...] = ()) -> None:
    """Checks `model_dir`, refuses to mix runs, and writes this run's flags beside the checkpoints.

    A directory holding a run whose essential flags differ is refused (the differing flags are
    listed) unless it never trained nor wrote a result (`holds_results`: a failed start, whose
    record is set aside) or `overwrite`, which first moves the run's files into a new
    `<model_dir>/overwritten-<time>/` (`_set_aside_run`: nothing is deleted). A model_dir whose
    run folders (train/, test/, checkpoints/, ...) hold files no run writes, e.g. a folder
    dataset's root, is refused, naming them, and so are parts of a run that are symbolic links
    and a run's outputs without flags.json (`check_run_parts`, on every worker, before the
    record is read or anything written). A run that has trained (a pretraining, a probe's
    head) resumes only with the values of its `trajectory` flags, unless
    `--allow_flag_changes` (each accepted change appended to `flags_history.jsonl` with the
    step, or epoch, from which it applies) or `overwrite`; its first record (`flags.json`) is kept,
    `flags.cfg` holds the flags of the latest start. The writing process (`chief`) holds the
    model_dir's lock (`lock`) before it deletes or writes anything: a second process is refused.
    """
    check_run_parts(model_dir)
    check_writable(model_dir)
    step, changed, diff = 0, {}, {}
    if os.path.exists(os.path.join(model_dir, "flags.json")):
        checked = {"stage", "backend", *essential, *trajectory}
        saved = read_flags_record(os.path.join(model_dir, "flags.json"),
                                  {k: v for k, v in run_flags.items() if k in checked})
        # A start that failed before it trained or wrote a result (a bad --pretrained, an
        # out-of-memory batch) left only its record: the corrected command starts afresh there,
        # the old record set aside (`_set_aside_run`), instead of being refused as another run.
        diff = _essential_differences(model_dir, saved, run_flags, essential,
                                      restart=overwrite or not holds_results(model_dir))
        step, changed = _trajectory_changes(model_dir, saved, run_flags, trajectory)
        if changed and not (overwrite or run_flags.get("allow_flag_changes")):
            unit = "step" if run_flags.get("stage") == "pretext" else "epoch"
            raise UsageError(f"--model_dir={model_dir} holds a run trained to {unit} {step} with "
                             f"other values of flags that change its course "
                             f"({_changes_text(changed)}). Resume with its flags (--flagfile="
                             f"{os.path.join(model_dir, 'flags.cfg')}), pass --allow_flag_changes "
                             f"to change them from this step on (recorded in {HISTORY}), "
                             "--overwrite to start afresh there, or choose a new --model_dir.")
    if chief:
        _write_records(model_dir, run_flags, flagfile, overwrite, diff, step, changed)


def _changes_text(changed: dict) -> str:
    return ", ".join(f"--{k}: {a!r} until now, {b!r} asked" for k, (a, b) in changed.items())


def _essential_differences(model_dir: str, saved: dict, run_flags: dict,
                           essential: tuple[str, ...], restart: bool) -> dict:
    """``{flag: (saved, now)}`` of the essential flags (and the backend) that differ from the
    saved run's; a UsageError listing them unless the run may `restart` afresh."""
    # A flag newer than the saved run is absent from it: that run had its default behaviour.
    diff = {k: (saved.get(k), run_flags.get(k)) for k in essential
            if k in saved and saved[k] != run_flags.get(k)}
    # The Keras backend (recorded by program.keras_native_backend; absent: tensorflow) fixes
    # the checkpoint format, so a run continues only on the backend that started it.
    backends = saved.get("backend", "tensorflow"), run_flags.get("backend", "tensorflow")
    if backends[0] != backends[1]:
        if not restart:
            raise UsageError(f"--model_dir={model_dir} holds a run of the {backends[0]} "
                             f"backend, whose checkpoints KERAS_BACKEND={backends[1]} cannot "
                             f"continue; rerun it with KERAS_BACKEND={backends[0]}, pass "
                             "--overwrite to start afresh there, or choose a new --model_dir.")
        diff["backend"] = backends
    if diff and not restart:
        lines = ", ".join(f"--{k}: saved {a!r}, now {b!r}" for k, (a, b) in diff.items())
        raise UsageError(f"--model_dir={model_dir} holds a run with different essential "
                         f"flags ({lines}). Resume with the saved flags "
                         f"(--flagfile={os.path.join(model_dir, 'flags.cfg')}), pass "
                         "--overwrite to start afresh there, or choose a new --model_dir.")
    return diff


def _write_records(model_dir: str, run_flags: dict, flagfile: str, overwrite: bool,
                   diff: dict, step: int, changed: dict) -> None:
    """Under the model_dir's lock: the run set aside (`diff`, or `changed` with `overwrite`),
    the accepted `changed` flags appended to the history, flags.cfg, and flags.json when this
    start begins the run."""
    lock(model_dir)
    first_record = True
    if diff or (overwrite and changed):  # diff: with --overwrite, or nothing trained yet
        _set_aside_run(model_dir, "--overwrite" if overwrite else
                       "Other essential flags where the last start trained nothing")
    elif step:
        first_record = False  # the record of what trained so far stays
        if changed:
            with open_for_writing(os.path.join(model_dir, HISTORY), "a", _PART_FIX) as f:
                f.write(json.dumps({"step": step, "changed": changed}, default=str) + "\n")
            print(f"Flags changed from step {step} on: {_changes_text(changed)} (recorded in "
                  f"{HISTORY}).", flush=True)
    write_atomically(os.path.join(model_dir, "flags.cfg"), flagfile, _PART_FIX)
    if first_record:
        write_atomically(os.path.join(model_dir, "flags.json"),
                         json.dumps(run_flags, indent=2, sort_keys=True, default=str), _PART_FIX)
