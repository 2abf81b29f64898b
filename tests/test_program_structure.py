"""The program's structure: no import cycle, modules that import alone, small modules, and a
flag-support table with a row for every flag (issue "One program on every Keras backend")."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
from absl import flags

from aetv2_tf.program import flag_support
from aetv2_tf.program import flags as _defined  # noqa: F401 - defines the flags
from aetv2_tf.program.rundir import UsageError

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "aetv2_tf"


def module_names() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere (top level or inside functions)."""
    modules = module_names()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                             for a in node.names)
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


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    tf_adapter = "aetv2_tf.program.adapter_tensorflow"
    portable = "aetv2_tf.program.adapter_portable"
    assert "aetv2_tf.program.common" in graph[portable] & graph[tf_adapter]
    # one pretext loop and one probe stage, used by both adapters, importing neither
    for shared in ("aetv2_tf.program.pretext", "aetv2_tf.probes.stage"):
        assert shared in graph[portable] & graph[tf_adapter], shared
        assert not {"aetv2_tf.train", tf_adapter, portable} & graph[shared], shared
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # the entry point picks an adapter; the adapters are siblings that do not import each other
    assert {tf_adapter, portable} <= graph["aetv2_tf.train"]
    assert "aetv2_tf.train" not in graph[portable] | graph[tf_adapter]
    assert portable not in graph[tf_adapter] and tf_adapter not in graph[portable]
    assert portable not in graph["aetv2_tf.program.common"]
    # the library never imports the program layer's entry point or adapters
    library = [m for m in graph if not m.startswith(("aetv2_tf.program", "aetv2_tf.train",
                                                     "aetv2_tf.probes.stage"))]
    assert not any({tf_adapter, portable, "aetv2_tf.train"} & graph[m] for m in library)


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


def defined_flags() -> list[str]:
    return sorted(f.name for f in flags.FLAGS.get_flags_for_module("aetv2_tf.program.flags"))


def test_every_flag_has_a_row_in_the_support_table():
    assert sorted(flag_support.TABLE) == defined_flags()


class _Flag:
    def __init__(self, value, present=True):
        self.value, self.present = value, present


@pytest.mark.parametrize("name", [n for n, rule in flag_support.TABLE.items() if rule])
def test_each_refused_value_names_the_flag_the_backend_and_the_fix(name, monkeypatch):
    rule = flag_support.TABLE[name]
    monkeypatch.setattr(flag_support, "tensorflow_importable", lambda: False)
    messages = flag_support.refusals("jax", {name: _Flag(rule.example)})
    assert len(messages) == 1
    assert messages[0].startswith(f"--{name}=") and "KERAS_BACKEND=jax" in messages[0]
    assert "KERAS_BACKEND=tensorflow" in messages[0]
    with pytest.raises(UsageError, match=f"--{name}="):
        flag_support.check("jax", {name: _Flag(rule.example)})
    assert flag_support.refusals("tensorflow", {name: _Flag(rule.example)}) == []


def test_the_defaults_run_everywhere(monkeypatch):
    monkeypatch.setattr(flag_support, "tensorflow_importable", lambda: False)
    defaults = {f.name: _Flag(f.default, present=False)
                for f in flags.FLAGS.get_flags_for_module("aetv2_tf.program.flags")}
    assert flag_support.refusals("jax", defaults) == []


def test_export_is_refused_only_where_tensorflow_cannot_be_imported(monkeypatch):
    given = {"export": _Flag(True, present=True)}
    monkeypatch.setattr(flag_support, "tensorflow_importable", lambda: True)
    assert flag_support.refusals("jax", given) == []
    monkeypatch.setattr(flag_support, "tensorflow_importable", lambda: False)
    assert "--export=true" in flag_support.refusals("jax", given)[0]


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
            given = {"dataset": _Flag(dataset), "stage": _Flag(stage)}
            assert bool(flag_support.refusals("jax", given)) == refused, (dataset, stage)


def test_intervals_are_due_when_crossed_not_only_on_multiples():
    """After a resume at step 1001 with --steps_per_execution=4 the steps are 1005, 1009, ...:
    checkpoints and summaries every 100 steps still fire (at 1101), once per interval."""
    from aetv2_tf.program.callbacks import due

    steps = range(1001, 1400, 4)
    fired = [s for prev, s in zip(steps, steps[1:], strict=False) if due(s, prev, 100)]
    assert fired == [1101, 1201, 1301] and not due(5, 4, 0)
    assert [s for s in range(1, 8) if due(s, s - 1, 3)] == [3, 6]  # every step: multiples
