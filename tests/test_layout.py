"""The test suite's own layout: a test module never imports another one, every shared helper is
defined once (tests/numerics.py, tests/folders.py, tests/cli.py, ...) and imported under its
package name (`tests.<module>`, one module object per process)."""

from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
#: Every module of the suite: the test files, their helper modules, conftest and the child site.
MODULES = sorted(TESTS.rglob("*.py"))
HELPERS = {path.stem for path in TESTS.glob("*.py") if not path.stem.startswith("test_")}


def imported_modules(tree: ast.Module) -> set[str]:
    """The modules a file imports anywhere: ``import a.b`` -> a.b; ``from a import b`` -> a and
    a.b (b may be a submodule)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def is_fixture(node: ast.FunctionDef) -> bool:
    """Decorated with ``pytest.fixture`` (called or not) or a bare ``fixture``."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "fixture":
            return True
    return False


def helper_names(tree: ast.Module) -> set[str]:
    """The module-level functions and classes of a file that are neither tests, fixtures nor
    pytest hooks: the helpers, which live in one module each."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not (node.name.startswith(("test_", "pytest_")) or is_fixture(node)):
                names.add(node.name)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("Test"):
            names.add(node.name)
    return names


def test_the_rules_see_what_they_look_for():
    tree = ast.parse("import tests.test_a\nfrom test_b import c\nfrom tests import test_d\n"
                     "def helper(): pass\ndef test_e(): pass\nclass Case: pass\n"
                     "@pytest.fixture(scope='module')\ndef data(): pass\n"
                     "def pytest_collection_modifyitems(items): pass\n")
    assert {"tests.test_a", "test_b", "tests.test_d"} <= imported_modules(tree)
    assert helper_names(tree) == {"helper", "Case"}
    assert len(MODULES) > 50 and {"cli", "numerics", "folders", "conftest"} <= HELPERS


def test_no_test_module_imports_another():
    """What two test files share is a helper module's; importing a test file from another
    would run its module-level code twice and collect nothing of it."""
    found = {}
    for path in MODULES:
        tests = {m for m in imported_modules(ast.parse(path.read_text()))
                 if m.rpartition(".")[2].startswith("test_")}
        if tests:
            found[str(path.relative_to(TESTS))] = sorted(tests)
    assert found == {}


def test_every_helper_is_defined_in_one_module():
    where: dict[str, list[str]] = {}
    for path in MODULES:
        for name in helper_names(ast.parse(path.read_text())):
            where.setdefault(name, []).append(str(path.relative_to(TESTS)))
    assert {name: files for name, files in where.items() if len(files) > 1} == {}


def test_helper_modules_are_imported_by_their_package_name():
    """``from tests.cli import ...``, never ``from cli import ...`` (which pytest's sys.path
    allows too, loading a second copy of the module beside ``tests.cli``)."""
    bare = {}
    for path in MODULES:
        names = {m for m in imported_modules(ast.parse(path.read_text()))
                 if m.partition(".")[0] in HELPERS}
        if names:
            bare[str(path.relative_to(TESTS))] = sorted(names)
    assert bare == {}
