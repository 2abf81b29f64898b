"""The program's structure: the library never imports the program layer, no import cycle (the
package, the benchmarks and the experiments; the package imports neither, the benchmarks never
the experiments), modules that import alone, small modules, and a flag-support table
with a row for every flag, and no class defined inside a function."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
from absl import flags

from aetv2_tf import errors
from aetv2_tf.program import flag_support
from aetv2_tf.program.flags import GROUPS, program_flags
from aetv2_tf.program.rundir import UsageError

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "aetv2_tf"
BENCHMARKS = PACKAGE.parent / "benchmarks"
EXPERIMENTS = PACKAGE.parent / "experiments"
#: The program layer: its subpackage and the command lines (`python -m aetv2_tf.<name>`).
PROGRAM = "aetv2_tf.program"
ENTRY_POINTS = ("aetv2_tf.train", "aetv2_tf.export", "aetv2_tf.report")


def module_names(*roots: pathlib.Path) -> dict[str, pathlib.Path]:
    """Module name -> file, for every module of the packages at ``roots`` (default: aetv2_tf)."""
    out = {}
    for root in roots or (PACKAGE,):
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def is_program(module: str) -> bool:
    return module == PROGRAM or module.startswith(PROGRAM + ".") or module in ENTRY_POINTS


def library_modules() -> dict[str, pathlib.Path]:
    return {name: path for name, path in module_names().items() if not is_program(name)}


def imports(source: str, name: str, is_package: bool = False) -> list[tuple[str, list[str]]]:
    """Every import of module ``name``, anywhere (top level, inside functions, classes or ``if``
    blocks), made absolute: ``import a.b`` -> (a.b, []); ``from a import b, c`` -> (a, [b, c])."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((base, [a.name for a in node.names]))
    return found


def imported_names(source: str, name: str, is_package: bool = False) -> set[str]:
    """``import a.b`` -> a.b; ``from a import b`` -> a and a.b (a submodule or a name)."""
    return {n for base, names in imports(source, name, is_package)
            for n in (base, *(f"{base}.{a}" for a in names))}


def import_graph(*roots: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere (top level or inside functions)."""
    modules = module_names(*roots)
    graph = {}
    for name, path in modules.items():
        found = set()
        for base, names in imports(path.read_text(), name, path.name == "__init__.py"):
            found.update(f"{base}.{a}" if f"{base}.{a}" in modules else base for a in names)
            found.update([] if names else [base])
        # A package's own __init__ is not an edge back to it from its submodules.
        graph[name] = {m for m in found if m in modules and m != name
                       and not name.startswith(m + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if not state.get(nxt) and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if not state.get(node) and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_imported_names_sees_every_import():
    source = ("import os\nfrom . import knn\nfrom ..program.rundir import check_writable\n"
              "def f():\n    from aetv2_tf import train\n"
              "class C:\n    if True:\n        import aetv2_tf.program.flags\n")
    found = imported_names(source, "aetv2_tf.probes.x")
    assert {"aetv2_tf.probes.knn", "aetv2_tf.program.rundir", "aetv2_tf.train",
            "aetv2_tf.program.flags"} <= found
    assert [n for n in sorted(found) if is_program(n)] == [
        "aetv2_tf.program.flags", "aetv2_tf.program.rundir",
        "aetv2_tf.program.rundir.check_writable", "aetv2_tf.train"]


def test_the_library_never_imports_the_program_layer():
    """No library module imports `aetv2_tf.program`, an entry point (`train`, `export`,
    `report`) or absl's flags, anywhere in its code: the library takes explicit arguments."""
    library = library_modules()
    assert {"aetv2_tf.probes.classifier", "aetv2_tf.probes.frozen_encoder",
            "aetv2_tf.probes.splits",
            "aetv2_tf.files.savedmodel", "aetv2_tf.files.scalar_logs", "aetv2_tf.errors",
            "aetv2_tf.data.pipelines", "aetv2_tf.models.heads"} <= set(library)
    taken = {}
    for name, path in library.items():
        found = imported_names(path.read_text(), name, path.name == "__init__.py")
        bad = sorted(n for n in found if is_program(n) or n in ("absl.flags", "absl.app"))
        if bad:
            taken[name] = bad
    assert taken == {}
    # The packages that load their names lazily (importlib, which `imports` cannot see) load
    # library modules of their own.
    import aetv2_tf
    import aetv2_tf.data
    import aetv2_tf.probes

    for package, table in ((aetv2_tf, aetv2_tf._EXPORTS), (aetv2_tf.data, aetv2_tf.data._LAZY),
                           (aetv2_tf.probes, aetv2_tf.probes._EXPORTS)):
        loaded = {f"{package.__name__}.{module}" for module in table.values()}
        assert loaded <= set(library), sorted(loaded - set(library))


def test_one_usage_error_for_both_layers():
    from aetv2_tf.program import rundir

    assert UsageError is rundir.UsageError is errors.UsageError
    assert issubclass(errors.UsageError, ValueError)


def test_no_import_cycle_in_the_package_the_benchmarks_or_the_experiments():
    graph = import_graph(PACKAGE, BENCHMARKS, EXPERIMENTS)
    assert "benchmarks.step" in graph and "aetv2_tf.program.probe_stage" in graph
    assert "experiments.loss_screen.screen" in graph and "experiments.campaign.leg" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # the tools sit on the package: the package imports neither, the benchmarks (which users
    # run) never an experiment's script (experiments/README.md)
    tools = [m for m in graph if m.partition(".")[0] in ("benchmarks", "experiments")]
    assert {name: sorted(graph[name] & set(tools)) for name in graph
            if name.startswith("aetv2_tf") and graph[name] & set(tools)} == {}
    assert {name: sorted(m for m in graph[name] if m.startswith("experiments"))
            for name in graph if name.startswith("benchmarks")
            and any(m.startswith("experiments") for m in graph[name])} == {}
    # the benchmarks' parent and worker share their step, and the worker never imports the parent
    assert "benchmarks.backends" in graph["benchmarks.step"]
    assert "benchmarks.step_runner" in graph["benchmarks.step"] & graph["benchmarks.backends"]
    assert "benchmarks.step" not in graph["benchmarks.backends"]
    tf_backend = "aetv2_tf.program.tensorflow_backend"
    native = "aetv2_tf.program.keras_native_backend"
    for shared in ("aetv2_tf.program.backend", "aetv2_tf.program.config",
                   "aetv2_tf.program.pretext_stage"):
        assert shared in graph[native] & graph[tf_backend], shared
    # one run sequence, one pretext loop and one probe stage for both backends, importing neither
    for shared in ("aetv2_tf.program.stages", "aetv2_tf.program.pretext_stage",
                   "aetv2_tf.program.probe_stage", "aetv2_tf.program.run_control"):
        assert not {"aetv2_tf.train", tf_backend, native} & graph[shared], shared
    # the entry point picks a backend and runs the one sequence; the backends are siblings that
    # do not import each other
    assert {tf_backend, native, "aetv2_tf.program.stages"} <= graph["aetv2_tf.train"]
    assert "aetv2_tf.train" not in graph[native] | graph[tf_backend]
    assert native not in graph[tf_backend] and tf_backend not in graph[native]


@pytest.mark.slow
def test_every_module_imports_alone():
    """Each module imported with no other project module loaded before it (one process; the
    project's modules are dropped from sys.modules between imports, the libraries stay)."""
    code = (
        "import importlib, sys\n"
        f"names = {sorted(module_names())!r}\n"
        "for name in names:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'aetv2_tf']:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "print('imported', len(names))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"imported {len(module_names())}" in proc.stdout


def test_no_module_over_about_400_lines():
    sizes = {name: len(path.read_text().splitlines()) for name, path in module_names().items()}
    assert {name: n for name, n in sizes.items() if n > 420} == {}


def test_no_class_is_defined_inside_a_function():
    """Every class of the package is a module's (or a class's): a class made anew by each call
    of a function cannot be named, imported, tested or documented on its own."""
    inside = []
    for name, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside += [f"{name}.{node.name}: class {sub.name}" for sub in ast.walk(node)
                           if isinstance(sub, ast.ClassDef)]
    assert inside == []


def defined_flags() -> list[str]:
    return sorted(f.name for f in program_flags())


def test_every_row_of_the_support_table_is_a_flag_and_every_flag_has_a_group():
    """The table names flags, it does not declare them: a flag without a row runs on every
    backend; --helpfull lists the flags by purpose."""
    assert flag_support.TABLE and set(flag_support.TABLE) <= set(defined_flags())
    groups = flags.FLAGS.flags_by_module_dict()
    assert all(group in groups for group in GROUPS)
    assert sum(len(groups[group]) for group in GROUPS) == len(defined_flags())


@pytest.mark.parametrize("name", sorted(flag_support.TABLE))
def test_each_refused_value_names_the_flag_the_backend_and_the_fix(name, monkeypatch):
    rule = flag_support.TABLE[name]
    monkeypatch.setattr(flag_support, "tensorflow_importable", lambda: False)
    messages = flag_support.refusals("jax", {name: rule.example}, {name})
    assert len(messages) == 1
    assert messages[0].startswith(f"--{name}=") and "KERAS_BACKEND=jax" in messages[0]
    assert "KERAS_BACKEND=tensorflow" in messages[0]
    with pytest.raises(UsageError, match=f"--{name}="):
        flag_support.check("jax", {name: rule.example}, {name})
    assert flag_support.refusals("tensorflow", {name: rule.example}, {name}) == []


def test_the_defaults_run_everywhere(monkeypatch):
    monkeypatch.setattr(flag_support, "tensorflow_importable", lambda: False)
    defaults = {f.name: f.default for f in program_flags()}
    assert flag_support.refusals("jax", defaults, ()) == []


def test_export_is_refused_only_where_tensorflow_cannot_be_imported(monkeypatch):
    monkeypatch.setattr(flag_support, "tensorflow_importable", lambda: True)
    assert flag_support.refusals("jax", {"export": True}, {"export"}) == []
    monkeypatch.setattr(flag_support, "tensorflow_importable", lambda: False)
    assert "--export=true" in flag_support.refusals("jax", {"export": True}, {"export"})[0]


def test_tf_data_sources_run_in_the_probe_stages_where_tensorflow_is_importable(monkeypatch):
    """--dataset=<tfds or folder> under JAX: the probe stages read it with tf.data where
    TensorFlow is importable; pretraining reads folders itself (Pillow), with or without
    TensorFlow, and refuses tensorflow-datasets everywhere."""
    for importable in (True, False):
        monkeypatch.setattr(flag_support, "tensorflow_importable", lambda i=importable: i)
        for dataset, stage, refused in (
                ("folder", "probe", not importable), ("folder", "supervised", not importable),
                ("imagenet2012", "probe", not importable), ("folder", "pretext", False),
                ("imagenet2012", "pretext", True), ("cifar10", "pretext", False)):
            values = {"dataset": dataset, "stage": stage}
            assert bool(flag_support.refusals("jax", values, set(values))) == refused, \
                (dataset, stage)


def test_intervals_are_due_when_crossed_not_only_on_multiples():
    """After a resume at step 1001 with --steps_per_execution=4 the steps are 1005, 1009, ...:
    checkpoints and summaries every 100 steps still fire (at 1101), once per interval."""
    from aetv2_tf.program.run_length import due

    steps = range(1001, 1400, 4)
    fired = [s for prev, s in zip(steps, steps[1:], strict=False) if due(s, prev, 100)]
    assert fired == [1101, 1201, 1301] and not due(5, 4, 0)
    assert [s for s in range(1, 8) if due(s, s - 1, 3)] == [3, 6]  # every step: multiples
