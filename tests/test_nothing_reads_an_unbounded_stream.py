"""Nothing the program reads whole is a stream without end: flagfiles and the records it reads.

Issue "Nothing silently wrong", what is read: a flagfile that is a FIFO hung the program, and
`/dev/zero` as a flagfile took 2.1 GB of memory in 8 s, because absl reads a flagfile with a
plain `open` and `readlines`. Every flagfile (on the command line, inside a flagfile, inside a
run's flags.cfg) is now read first by `program.flagfiles` (a regular file of at most 1 MiB,
text, no loop), and every record read back whole (flags.json, budget.json,
flags_history.jsonl, results.json, an export's manifest, a checksum, the precision cache) by
`files.safe_paths.read_regular_file`. Then random and mutated flagfiles (Hypothesis) are fed to
the program's flag parsing in this process: each ends within seconds, accepted or refused with
a message (exit 2 ``error: ...``, or absl's exit 1), never a traceback. The number of examples
is $AETV2_FLAGFILE_EXAMPLES (default 300; docs/reliability.md records a run of 10,000).
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading

import pytest
from absl.testing import flagsaver
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aetv2_tf.data.sources import DataError
from aetv2_tf.errors import UsageError
from aetv2_tf.files import provenance, saving
from aetv2_tf.probes import results
from aetv2_tf.program import config as run_config
from aetv2_tf.program import flagfiles, precision, rundir
from aetv2_tf.program.flags import FLAGS, parse_command_line, program_flags
from tests.cli import REPO, _env

CONFIGS = sorted((REPO / "configs").glob("*.cfg"))


class TookTooLong(BaseException):
    """Raised in the main thread by `time_limit`: a BaseException, so that no ``except
    OSError`` (or ``except Exception``) of the code under test takes it for its own."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Fails the test (`TookTooLong`) where the block has not ended after ``seconds``: a read
    that blocks (a FIFO) or never ends (a device) fails here instead of hanging the suite. The
    alarm is sent to the main thread itself (`pthread_kill`: a process signal may go to any of
    TensorFlow's threads, leaving the main thread blocked in its system call), and again every
    ``seconds`` until the block ends."""
    def expire(*_):
        raise TookTooLong(f"still running after {seconds} s")

    def alarm():
        while not done.wait(seconds):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)

    previous, done = signal.signal(signal.SIGALRM, expire), threading.Event()
    timer = threading.Thread(target=alarm, daemon=True)
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.join()  # an alarm already sent reaches `expire`, never the default action
        signal.signal(signal.SIGALRM, previous)


def parsed(*args: str) -> tuple[int, str]:
    """``(exit code, stderr)`` of the training program's flag parsing and configuration for
    the command line ``args`` (after the program's name), in this process within 20 s, as
    `aetv2_tf.train` runs them: `parse_command_line` (`absl.app.run`'s parser), positional
    arguments refused (exit 1), then `config.from_flags` (exit 2 on its refusals). The flags
    are restored afterwards."""
    argv, err = ["train", *args], io.StringIO()
    saved = flagsaver.save_flag_values(FLAGS)
    FLAGS.unparse_flags()
    try:
        with time_limit(20), contextlib.redirect_stderr(err):
            left = parse_command_line(argv)
            if len(left) > 1:
                print(f"FATAL: unexpected arguments {left[1:]}", file=sys.stderr)
                return 1, err.getvalue()
            try:
                run_config.from_flags(FLAGS, argv)
            except (UsageError, DataError, FileNotFoundError) as e:
                print(f"error: {e}", file=sys.stderr)
                return 2, err.getvalue()
    except SystemExit as e:
        return int(e.code or 0), err.getvalue()
    finally:
        FLAGS.unparse_flags()
        flagsaver.restore_flag_values(saved, FLAGS)
    return 0, err.getvalue()


@pytest.fixture
def files(tmp_path) -> pathlib.Path:
    """A folder with a FIFO, a folder, a file over 1 MiB and text that is not UTF-8."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    (tmp_path / "huge.cfg").write_text("# a comment\n" * 100_000)  # 1.2 MB
    (tmp_path / "latin1.cfg").write_bytes(b"--method=caf\xe9\n")
    return tmp_path


# --------------------------------------------------------------- the flagfiles
@pytest.mark.parametrize("flagfile, message", [
    ("fifo", r"--flagfile=\S*fifo: not a regular file \(a FIFO"),
    ("/dev/zero", r"--flagfile=/dev/zero: not a regular file \(a device"),
    ("folder", r"folder: not a regular file \(a folder\)"),
    ("huge.cfg", r"huge.cfg: larger than 1048576 bytes; a flagfile is a text file"),
    ("latin1.cfg", r"latin1.cfg: not utf-8 text \(invalid continuation byte at byte 12\)"),
    ("nested_fifo.cfg", r"--flagfile=\S*fifo \(named in \S*nested_fifo.cfg\): not a regular"),
    ("nested_zero.cfg", r"--flagfile=/dev/zero \(named in \S*nested_zero.cfg\): not a regular"),
    ("loop.cfg", r"the flagfile names itself \(\S*loop.cfg -> \S*/./loop.cfg\)"),
    ("fan_out.cfg", r"more than 64 flagfiles for one command line"),
    ("many_bytes.cfg", r"the flagfiles of this command line hold more than 1048576 bytes"),
])
def test_a_flagfile_that_is_not_a_small_text_file_is_refused_before_absl_reads_it(
        files, flagfile, message):
    """Exit 2 with `error: --flagfile=...` naming the file (and the flagfile that named it),
    within seconds (before: a FIFO blocked forever, /dev/zero filled the memory, a loop under
    another spelling overflowed the stack), nothing written."""
    (files / "nested_fifo.cfg").write_text(f"--batch_size=8\n--flagfile={files / 'fifo'}\n")
    (files / "nested_zero.cfg").write_text("--flagfile=/dev/zero\n")
    (files / "loop.cfg").write_text(f"--batch_size=8\n--flagfile={files}/./loop.cfg\n")
    (files / "leaf.cfg").write_text("--batch_size=8\n")
    (files / "fan_out.cfg").write_text(f"--flagfile={files / 'leaf.cfg'}\n" * 65)
    (files / "half.cfg").write_text("#" * 600_000 + "\n")
    (files / "many_bytes.cfg").write_text(f"--flagfile={files / 'half.cfg'}\n" * 2)
    path = flagfile if flagfile.startswith("/") else files / flagfile
    code, err = parsed(f"--flagfile={path}", f"--model_dir={files / 'run'}")
    assert code == 2 and re.search(message, err, re.I), err
    assert not (files / "run").exists()


def test_a_flagfile_inside_a_runs_flags_cfg_is_read_with_the_same_limits(tmp_path):
    """A run's flags.cfg (`RunConfig.flagfile_text`) given back as a flagfile, with a line
    added that names /dev/zero: refused the same way."""
    run = tmp_path / "run"
    run.mkdir()
    code, _ = parsed(f"--model_dir={run}", "--train_steps=4")
    assert code == 0
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        FLAGS(["train", f"--model_dir={run}", "--train_steps=4"])
        text = run_config.from_flags(FLAGS, ["train"]).flagfile_text()
    (run / "flags.cfg").write_text(text + "--flagfile=/dev/zero\n")
    code, err = parsed(f"--flagfile={run / 'flags.cfg'}")
    assert code == 2 and "--flagfile=/dev/zero (named in" in err and "flags.cfg" in err, err


def test_what_absl_refuses_of_a_flagfile_stays_absls(tmp_path):
    """A missing flagfile, `--flagfile` without a name: exit 1 in absl's words, as before."""
    code, err = parsed(f"--flagfile={tmp_path / 'missing.cfg'}")
    assert code == 1 and "FATAL Flags parsing error: ERROR:: Unable to open flagfile" in err, err
    assert "missing.cfg" in err
    code, err = parsed("--model_dir=x", "--flagfile")
    assert code == 1 and "--flagfile with no argument" in err, err


@pytest.mark.slow
def test_the_program_refuses_a_fifo_flagfile_at_once(tmp_path):
    """`python -m aetv2_tf.train --flagfile=FIFO` (the issue's command): exit 2 within seconds,
    before Keras is imported (before: it waited forever for a writer)."""
    os.mkfifo(tmp_path / "fifo")
    proc = subprocess.run([sys.executable, "-m", "aetv2_tf.train", f"--flagfile={tmp_path}/fifo",
                           f"--model_dir={tmp_path / 'run'}"], cwd=REPO, env=_env({}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a regular file (a FIFO" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


# ---------------------------------------------------- the expansion is absl's, file by file
TREES = st.recursive(
    st.lists(st.sampled_from(["--batch_size=8", "  --seed=3  ", "# --seed=4", "// x", "",
                              "   ", "--train_steps=5\r", "-flagfile=", "--nosomething",
                              "--method=a b", "\t--verbose=0"]), max_size=4),
    lambda inner: st.lists(st.one_of(st.sampled_from(["--seed=1", "# c"]), inner),
                           max_size=4), max_leaves=12)


def write_tree(root: pathlib.Path, tree, counter: list[int]) -> str:
    """Writes ``tree`` (nested lists: a list is a flagfile, a string a line) as flagfiles
    under ``root``; returns the top file's name."""
    counter[0] += 1
    path = root / f"f{counter[0]}.cfg"
    lines = []
    for item in tree:
        lines.append(f"--flagfile={write_tree(root, item, counter)}" if isinstance(item, list)
                     else item)
    path.write_bytes("\n".join(lines).encode() + (b"\n" if len(lines) % 2 else b""))
    return str(path)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(TREES, st.sampled_from(["--flagfile={}", "-flagfile={}", "--flagfile {}"]))
def test_expand_gives_the_arguments_absl_gives(tmp_path, tree, form):
    """`flagfiles.expand` (which the configuration uses to find the flag given last) against
    absl's own `read_flags_from_files` on nested flagfiles with comments, blank lines, CR
    line ends, indentation and every spelling of the directive; and on every config."""
    root = tmp_path / f"tree{len(list(tmp_path.iterdir()))}"
    root.mkdir()
    top = write_tree(root, tree, [0])
    args = ["--model_dir=x", *form.format(top).split(" "), "--seed=2", "--", "--flagfile=y"]
    assert flagfiles.expand(args) == FLAGS.read_flags_from_files(args, force_gnu=False)


def test_expand_reads_every_config_as_absl_does():
    for config in CONFIGS:
        args = [f"--flagfile={config}", "--batch_size=8"]
        assert flagfiles.expand(args) == FLAGS.read_flags_from_files(args, force_gnu=False)


# ------------------------------------------------------------- random and mutated flagfiles
FLAG_NAMES = sorted(f.name for f in program_flags())
#: Flagfiles a fuzzed line names, from the folder the program runs in (`fuzz/sub`): the two
#: fuzzed files ("top.cfg" names itself), a FIFO, a folder, devices, nothing, the home folder.
NAMED = ["top.cfg", "../top.cfg", "./top.cfg", "../fifo", "../folder", "/dev/zero",
         "/dev/null", "missing.cfg", "", "~"]
LINES = st.one_of(
    st.builds(lambda n, v: f"--{n}={v}", st.sampled_from(FLAG_NAMES),
              st.one_of(st.text(max_size=12), st.integers().map(str), st.floats().map(repr))),
    st.builds(lambda n: f"--no{n}", st.sampled_from(FLAG_NAMES)),
    st.builds(lambda t: f"--flagfile={t}", st.sampled_from(NAMED)),
    st.sampled_from(["--flagfile", "-flagfile=../top.cfg", "--undefok=zzz", "--zzz=1", "# comment",
                     "", "--", "positional", "--stage=probe", "--pretext=rotation",
                     "--train_seconds=10", "--lr_drop_epochs=1,2", "--helpshort"]),
    st.text(max_size=40),
    st.integers(0, 3 * 2**20).map(lambda n: "x" * n))  # a huge line (over 1 MiB too)


def with_lines_changed(config: str, data) -> bytes:
    """The text of ``config`` with some of its lines deleted, replaced or added."""
    lines = pathlib.Path(config).read_text().splitlines()
    for _ in range(data.draw(st.integers(0, 4))):
        at = data.draw(st.integers(0, len(lines)))
        how = data.draw(st.sampled_from(["delete", "replace", "insert"]))
        if how == "delete" and at < len(lines):
            del lines[at]
        else:
            lines[at:at + (how == "replace")] = [data.draw(LINES)]
    return "\n".join(lines).encode()


def flagfile_bytes(data) -> bytes:
    """A flagfile's bytes: random bytes, random lines, or a mutated config."""
    kind = data.draw(st.sampled_from(["bytes", "lines", "config"]))
    event(f"flagfile of {kind}")
    if kind == "bytes":
        return data.draw(st.binary(max_size=200))
    if kind == "lines":
        return "\n".join(data.draw(st.lists(LINES, max_size=8))).encode("utf-8",
                                                                         "surrogatepass")
    return with_lines_changed(str(data.draw(st.sampled_from(CONFIGS))), data)


@settings(max_examples=int(os.environ.get("AETV2_FLAGFILE_EXAMPLES", "300")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example])
@given(st.data())
def test_random_flagfiles_end_in_a_config_or_a_message_never_a_traceback(tmp_path_factory,
                                                                         data):
    """Random bytes, random lines (every flag, unknown flags, huge lines, nested flagfiles
    naming FIFOs, devices, folders, themselves) and mutated configs, as a flagfile and as a
    flagfile it names: each ends within 20 s (`parsed`), in a config (exit 0) or a refusal
    with a message (exit 2 `error: ...`, exit 1 absl's `FATAL Flags parsing error` or usage),
    never a traceback, nothing written."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "sub").mkdir()
    (root / "folder").mkdir()
    os.mkfifo(root / "fifo")
    (root / "top.cfg").write_bytes(flagfile_bytes(data))
    (root / "sub" / "top.cfg").write_bytes(flagfile_bytes(data))
    cwd = os.getcwd()
    os.chdir(root / "sub")  # "top.cfg" and "../top.cfg" name the two files
    try:
        code, err = parsed(f"--model_dir={root / 'run'}", "--train_steps=4",
                           "--flagfile=../top.cfg", *data.draw(st.lists(LINES, max_size=2)))
    finally:
        os.chdir(cwd)
    event(f"exit {code}")
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert err.startswith("error: "), err
    elif code == 1:
        assert "FATAL" in err or "Flags parsing error" in err or "usage" in err.lower() or \
            err.strip(), err
    assert not (root / "run").exists()
    shutil.rmtree(root)


# ------------------------------------------------------ the records the program reads back
def make_fifo(path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def test_every_record_read_back_refuses_a_fifo_a_device_and_a_huge_file(tmp_path):
    """Each reader, given a FIFO (which blocked it forever), a link to /dev/zero (endless) and
    a file over 1 MiB, refuses within seconds with its own message naming the file."""
    readers = {
        "flags.json": lambda d: rundir.read_flags_record(str(d / "flags.json")),
        "budget.json": lambda d: run_config.recorded_budget(_budgeted(d)),
        "results.json": lambda d: results.read_results(d / "results.json"),
        "aetv2_export.json": lambda d: _raise_if(provenance.verify_export(str(d))),
        "ckpt.weights.h5.sha256": lambda d: _raise_if(
            saving.damage(str(d / "ckpt.weights.h5"), required=True)),
        "flags_history.jsonl": lambda d: rundir._effective_flags(str(d), {}),
    }
    for name, read in readers.items():
        for kind in ("fifo", "zero", "huge"):
            folder = tmp_path / f"{name}-{kind}"
            folder.mkdir()
            (folder / "ckpt.weights.h5").write_bytes(b"weights")
            if kind == "fifo":
                make_fifo(folder / name)
            elif kind == "zero":
                (folder / name).symlink_to("/dev/zero")
            else:
                (folder / name).write_bytes(b" " * (2**20 + 1))
            with time_limit(10), pytest.raises(ValueError) as info:
                read(folder)
            said = str(info.value)
            assert name in said and ("not a regular file" in said or "larger than" in said
                                     or "it has no aetv2_export.json" in said
                                     and kind != "huge"), (name, kind, said)


def _raise_if(why: str | None) -> None:
    if why:
        raise ValueError(why)


def _budgeted(model_dir: pathlib.Path) -> run_config.RunConfig:
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        argv = ["train", f"--model_dir={model_dir}", "--train_seconds=60"]
        FLAGS(argv)
        return run_config.from_flags(FLAGS, argv)


def test_the_precision_cache_and_the_version_check_pass_over_what_they_cannot_read(tmp_path):
    """Readers that treat an unreadable file as absent do so for a FIFO too, at once: the
    precision cache (probed again) and the 0.1 check (left to `rundir`, which names it)."""
    cache = make_fifo(tmp_path / "cache.json")
    with time_limit(10):
        assert precision._load_cache(str(cache)) == {}
        make_fifo(tmp_path / "run" / "flags.json")
        assert run_config.check_run_version(str(tmp_path / "run")) is None
