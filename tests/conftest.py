"""Shared fixtures: the real CIFAR-10 in ../shared (never downloaded); the longest test files
first, so that the workers of `pytest -n` (pyproject's addopts) end together."""

import os
import pathlib
import shutil
import sys
import tempfile
import uuid

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# `--mixed_precision=auto` caches its CPU measurement: one probe per test session, not ~/.cache.
# The first process that loads this file (pytest, xdist's controller) makes the folder; the
# workers and every child process inherit it, and its maker's end removes it.
_MADE_CACHE = "AETV2_CACHE_DIR" not in os.environ
if _MADE_CACHE:  # (not `setdefault(..., mkdtemp())`: that made a folder in every worker too)
    os.environ["AETV2_CACHE_DIR"] = tempfile.mkdtemp(prefix="aetv2-test-cache-")
    # Temporary files of the processes the tests start (and kill: TensorFlow's autograph
    # sources, removed at a normal exit, stay behind a SIGKILL) go with the folder. This
    # process's `tempfile` already chose /tmp: pytest's own tmp_path folders stay there.
    os.environ["TMPDIR"] = os.path.join(os.environ["AETV2_CACHE_DIR"], "tmp")
    os.makedirs(os.environ["TMPDIR"])
CACHE = os.environ["AETV2_CACHE_DIR"]
# This pytest session's name, the same in its xdist workers (which inherit it): what the session
# shares through the cache folder (`finished_run`) is its own, even in a folder that was given.
SESSION = os.environ.setdefault("AETV2_TEST_SESSION", uuid.uuid4().hex)
# The Keras-on-JAX children compile the same steps again and again (the same tiny run resumed,
# probed, on two devices): XLA's persistent compilation cache, shared by the session's processes,
# compiles each once. A cached executable is the one XLA would compile (the CLI's outputs are
# the same bitwise: the resume tests compare digests); it halves a tiny JAX run's CPU time.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(CACHE, "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

# Child processes start with tests/child_site/sitecustomize.py, which hides the test extras that
# Keras and TensorFlow import at start-up when installed (scikit-learn, OpenCV; JAX under TF):
# ~1.5 CPU-s less per child, and a child's environment is a user's install. The xdist workers,
# which inherit the variable, take back what it hid in them: the oracles run here.
CHILD_SITE = str(pathlib.Path(__file__).resolve().parent / "child_site")
if CHILD_SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [CHILD_SITE,
                                                             os.environ.get("PYTHONPATH")]))
for _name in getattr(sys.modules.get("sitecustomize"), "HIDDEN", ()):
    if sys.modules.get(_name, ()) is None:
        del sys.modules[_name]

import aetv2_tf  # noqa: E402,F401  (before any TensorFlow import: it asks for oneDNN on every CPU)

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CIFAR10 = REPO.parent / "shared" / "data" / "cifar10" / "cifar-10-batches-py"


@pytest.fixture(scope="session")
def cifar10_dir() -> pathlib.Path:
    """The official python-layout CIFAR-10 directory ($AETV2_CIFAR10_DIR or ../shared)."""
    path = pathlib.Path(os.environ.get("AETV2_CIFAR10_DIR", DEFAULT_CIFAR10))
    if not (path / "data_batch_1").is_file():
        raise FileNotFoundError(
            f"CIFAR-10 not found at {path}; set AETV2_CIFAR10_DIR to the cifar-10-batches-py dir"
        )
    return path


@pytest.fixture(scope="session")
def finished_run(cifar10_dir) -> tuple[pathlib.Path, str]:
    """(model_dir, its stdout): one finished tiny AETv2 run (`tests.cli.finished_run_args`),
    trained once per pytest session by whichever worker asks first (the others wait on a lock
    in the session's cache folder, then read it). Shared by several files: read it, never write
    into it; a test that changes a run works on a copy (`shutil.copytree`)."""
    import fcntl

    from tests.cli import finished_run_args, run_module

    shared = pathlib.Path(CACHE) / f"session-{SESSION}"
    shared.mkdir(exist_ok=True)
    model_dir, stdout = shared / "finished_run", shared / "finished_run.out"
    with open(shared / "finished_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not stdout.exists():
            shutil.rmtree(model_dir, ignore_errors=True)  # a run cut short by a failure
            proc = run_module("aetv2_tf.train", *finished_run_args(model_dir, cifar10_dir))
            stdout.write_text(proc.stdout)
    return model_dir, stdout.read_text()


@pytest.fixture
def program(monkeypatch):
    """`program(*args)` runs `aetv2_tf.train.main` with these flags in this process (the
    command line without the interpreter start) and returns its exit code; the flags and
    Keras's dtype policy are restored afterwards."""
    import keras

    from aetv2_tf import train
    from aetv2_tf.program.flags import FLAGS

    was_parsed = FLAGS.is_parsed()

    def run(*args: str) -> int:
        argv = ["train", "--verbose=0", "--mixed_precision=none", *args]
        monkeypatch.setattr(sys, "argv", argv)
        FLAGS.unparse_flags()
        FLAGS(argv)
        try:
            train.main(["train"])
        except SystemExit as e:
            return int(e.code or 0)
        return 0

    yield run
    FLAGS.unparse_flags()
    if was_parsed:  # as an earlier test left it: parsed, at the defaults (no validation, as
        FLAGS.mark_as_parsed()  # --model_dir's validator would refuse the defaults)
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture
def configured():
    """``configured(*args)``: the `RunConfig` of these flags (the command line without the
    interpreter start, ``--model_dir`` required as on the command line), parsed and read as
    `aetv2_tf.train.main` does; the flags are restored afterwards."""
    from absl.testing import flagsaver

    from aetv2_tf.program.config import from_flags
    from aetv2_tf.program.flags import FLAGS

    saved, was_parsed = flagsaver.save_flag_values(FLAGS), FLAGS.is_parsed()

    def read(*args: str):
        argv = ["train", *args]
        FLAGS.unparse_flags()
        FLAGS(argv)
        return from_flags(FLAGS, argv)

    yield read
    FLAGS.unparse_flags()
    flagsaver.restore_flag_values(saved, FLAGS)
    if was_parsed:
        FLAGS.mark_as_parsed()


# The files whose tests run longest (minutes of CLI child processes; `--durations` of a full run,
# docs/test-timings.md): collected first, and scheduled in this order (pyproject.toml's addopts
# `--no-loadscope-reorder`: xdist would otherwise sort the files by their number of tests), so
# that no worker starts one of them when the others are nearly done. The order of the tests
# inside a file is kept.
LONGEST_FIRST = ("test_library.py", "test_benchmarks.py", "test_reliability_interrupt.py",
                 "test_backend_parity.py", "test_jax_cli.py", "test_device_step.py",
                 "test_multiworker.py", "test_reliability_input.py", "test_imagenet_cli.py",
                 "test_campaign.py", "test_train_cli.py", "test_imagenet_input.py",
                 "test_learning.py", "test_precision.py", "test_probe_stage.py",
                 "test_any_backbone.py", "test_per_branch_one_pass.py",
                 "test_probe_stage_baselines.py", "test_loss_screen.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every file's own order is kept


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The caches go with the process that made them (never a folder that was given)."""
    if _MADE_CACHE:
        shutil.rmtree(CACHE, ignore_errors=True)

