"""The rules of the house that the code's shape can be checked for (CONTRIBUTING.md, "The
package"): every module's file name unique in the package, no import circle (between
packages, or between modules), no function over 80 lines, no module over 600 lines; the
broker reached through its one door (``fairqueue.broker``, never its modules); no
module at the package's top beyond the allowed list; no flow member built by hand
outside the wire module and its Lua half; each console page of one shape (a module with
one ``ConsolePage``, a frozen dataclass of its data, templates handed ``page`` alone).
The tests stand alone: no module of tests/ or
benchmarks/ imports a test module or a conftest (shared helpers live in tests/helpers/,
shared fixtures in the conftest files).

Imports are read with ``ast``, so an import inside a function (a lazy one) or under
``TYPE_CHECKING`` counts: either still ties the two ends together. Each check is tried on
a small tree that breaks it too, so none of them passes by seeing nothing."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fairqueue"
#: The suite and the benchmarks (which borrow the suite's settings and servers).
TEST_ROOTS = (PACKAGE.parent / "tests", PACKAGE.parent / "benchmarks")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
#: The modules allowed at the package's top (``__init__`` aside): a new one goes in the
#: feature package it belongs to (CONTRIBUTING.md, "The package").
TOP_MODULES = frozenset(
    "apps checks exceptions http loop metrics plans redis_metrics redis_target reporting "
    "signals tenants".split()
)
#: The one place each language builds a flow member (``level`` + line feed + ``tenant``).
WIRE_FILES = frozenset({"scheduling/wire.py", "broker/lua/include/wire.lua"})
#: A flow member joined by hand: in Python an f-string ``{..level..}\n{..tenant..}`` (or
#: ``{lvl...}``), in Lua ``level .. '\n' .. tenant`` (or ``.. t``).
HAND_BUILT_MEMBER = (
    re.compile(r"\{[^{}]*(level|lvl)[^{}]*\}\\n\{[^{}]*tenant[^{}]*\}"),
    re.compile(r"\w*level\w*\)? \.\. '\\n' \.\. \(?\w*(tenant|t)\b", re.IGNORECASE),
)


def modules(root: Path) -> dict[str, Path]:
    """Every module under ``root`` (a package folder) by its dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def shared_file_names(root: Path) -> list[str]:
    """File names two modules share (``__init__.py`` aside)."""
    names = Counter(path.name for path in root.rglob("*.py") if path.name != "__init__.py")
    return sorted(name for name, count in names.items() if count > 1)


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, anywhere in it. ``from p
    import m`` of a module ``m`` imports ``p.m`` (not ``p``, whose ``__init__`` only runs
    on the way)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known.keys()
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(base)
    return (found & known.keys()) - {name}


def owner(name: str, known: dict[str, Path]) -> str:
    """The package a module counts for: its subpackage of the root (``fairqueue.broker``);
    a module at the root's top (``fairqueue.conf``, the root's ``__init__``) is its own."""
    parts = name.split(".")
    top = ".".join(parts[:2])
    return top if len(parts) > 2 or known[top].name == "__init__.py" else name


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (each a strongly connected part of it, sorted)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in order:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], order[other])
        if low[node] == order[node]:
            part = []
            while not part or part[-1] != node:
                part.append(stack.pop())
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return sorted(found)


def import_graphs(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> modules it imports, package -> packages it imports), of ``root``."""
    known = modules(root)
    by_module = {name: imported(name, path, known) for name, path in known.items()}
    by_package: dict[str, set[str]] = {}
    for name, targets in by_module.items():
        mine = owner(name, known)
        theirs = {owner(target, known) for target in targets} - {mine}
        by_package.setdefault(mine, set()).update(theirs)
    return by_module, by_package


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Functions (methods, nested ones) of more than ``limit`` lines, from ``def`` to
    their last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.name} ({lines} lines)")
    return found


def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(root.parent)} ({lines} lines)")
    return found


def door_breaches(root: Path, door: str = "broker") -> list[str]:
    """Imports of a module inside ``root.<door>`` from a module outside it: the package
    ``door`` is the only way in (``from pkg.broker import X``)."""
    known = modules(root)
    inside = f"{root.name}.{door}"
    found = []
    for name, path in known.items():
        if name == inside or name.startswith(inside + "."):
            continue
        for target in sorted(imported(name, path, known)):
            if target.startswith(inside + "."):
                found.append(f"{name} -> {target}")
    return found


def extra_top_modules(root: Path, allowed: frozenset[str] = TOP_MODULES) -> list[str]:
    """Modules at the top of ``root`` not in ``allowed``."""
    return sorted(
        path.stem
        for path in root.glob("*.py")
        if path.stem != "__init__" and path.stem not in allowed
    )


def hand_built_members(root: Path, wire: frozenset[str] = WIRE_FILES) -> list[str]:
    """Lines of ``root``'s Python and Lua that join a level and a tenant with a line feed
    themselves instead of calling the wire module's ``flow_member``/``fqFlowMember``."""
    found = []
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.lua")]):
        if path.relative_to(root).as_posix() in wire:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(pattern.search(line) for pattern in HAND_BUILT_MEMBER):
                found.append(f"{path.relative_to(root.parent)}:{number}")
    return found


def imports_of_test_modules(*roots: Path) -> list[str]:
    """Imports of a test module (``test_*.py``) or a ``conftest`` by any module under
    ``roots``: a test module imported elsewhere runs its fixtures and module-level
    skips there too, and ties two tests' fates together."""
    known = {name: path for root in roots for name, path in modules(root).items()}
    shared = {
        name
        for name, path in known.items()
        if path.name.startswith("test_") or path.stem == "conftest"
    }
    return [
        f"{name} -> {target}"
        for name, path in known.items()
        for target in sorted(imported(name, path, known) & shared)
    ]


def page_shape_breaches(root: Path) -> list[str]:
    """Console page modules (those defining a ``ConsolePage`` subclass) of ``root``'s
    ``dashboard/`` not of the one shape: more than one page class, no frozen dataclass,
    or a ``_context(...)``/``_show(...)`` call handing its template anything but
    ``page=``."""
    found = []
    for path in sorted((root / "dashboard").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        pages = [
            node.name
            for node in tree.body
            if isinstance(node, ast.ClassDef)
            and any(getattr(base, "id", None) == "ConsolePage" for base in node.bases)
        ]
        if not pages:
            continue
        name = path.relative_to(root.parent).as_posix()
        if len(pages) > 1:
            found.append(f"{name}: {len(pages)} page classes")
        frozen = [
            node
            for node in tree.body
            if isinstance(node, ast.ClassDef)
            for deco in node.decorator_list
            if isinstance(deco, ast.Call)
            and any(
                k.arg == "frozen" and getattr(k.value, "value", False) is True
                for k in deco.keywords
            )
        ]
        if not frozen:
            found.append(f"{name}: no frozen dataclass")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("_context", "_show")
                and [k.arg for k in node.keywords] != ["page"]
            ):
                found.append(f"{name}:{node.lineno}: {node.func.attr} without page= alone")
    return found


# -- the package --------------------------------------------------------------------


def test_no_two_modules_share_a_file_name():
    assert shared_file_names(PACKAGE) == []


def test_no_package_imports_a_package_that_imports_it():
    _, by_package = import_graphs(PACKAGE)
    assert "fairqueue.broker" in by_package  # the package was read
    assert circles(by_package) == []


def test_no_module_imports_a_module_that_imports_it():
    by_module, _ = import_graphs(PACKAGE)
    assert "fairqueue.broker.scripts" in by_module["fairqueue.broker.connection"]
    assert circles(by_module) == []


def test_no_function_is_over_80_lines():
    assert long_functions(PACKAGE) == []


def test_no_module_is_over_600_lines():
    assert long_modules(PACKAGE) == []


def test_nothing_outside_the_broker_imports_its_modules():
    assert door_breaches(PACKAGE) == []


def test_no_module_at_the_top_beyond_the_allowed_list():
    assert extra_top_modules(PACKAGE) == []


def test_every_console_page_has_the_one_shape():
    assert "ConsolePage" in (PACKAGE / "dashboard" / "console_admin.py").read_text()
    assert page_shape_breaches(PACKAGE) == []


def test_no_flow_member_is_built_by_hand_outside_the_wire_module():
    assert (PACKAGE / "scheduling" / "wire.py").exists()
    assert hand_built_members(PACKAGE) == []


# -- the tests ------------------------------------------------------------------------


def test_no_test_module_imports_another_or_a_conftest():
    assert "tests.helpers" in modules(TEST_ROOTS[0])  # the suite was read
    assert imports_of_test_modules(*TEST_ROOTS) == []


# -- each check finds what it looks for ------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_shared_file_name_is_found(tmp_path):
    root = _tree(tmp_path, {"__init__.py": "", "a/__init__.py": "", "a/util.py": "",
                            "b/__init__.py": "", "b/util.py": ""})  # fmt: skip
    assert shared_file_names(root) == ["util.py"]


@pytest.mark.parametrize(
    "back",
    [
        "from pkg.a.one import x\n",  # at the top
        "def f():\n    from pkg.a import one\n",  # lazy, inside a function
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a.one\n",
        "from ..a.one import x\n",  # relative
    ],
)
def test_a_package_circle_is_found_however_the_import_is_written(tmp_path, back):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "",
            "a/one.py": "x = 1\n",
            "a/two.py": "from pkg.b.three import y\n",
            "b/__init__.py": "",
            "b/three.py": f"y = 2\n{back}",
            "c/__init__.py": "",
            "c/four.py": "from pkg.a import one\nfrom pkg.b import three\n",
        },
    )
    by_module, by_package = import_graphs(root)
    assert circles(by_package) == [["pkg.a", "pkg.b"]]
    assert circles(by_module) == []  # no module imports itself back: only the packages


def test_a_module_circle_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "top.py": "from pkg import low\n",
            "low.py": "def f():\n    import pkg.top\n",
            "d/__init__.py": "",
            "d/views.py": "from pkg.d.page import P\n",
            "d/page.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.d.views import V\n",
        },
    )
    by_module, by_package = import_graphs(root)
    assert circles(by_module) == [["pkg.d.page", "pkg.d.views"], ["pkg.low", "pkg.top"]]
    assert circles(by_package) == [["pkg.low", "pkg.top"]]  # top-level modules count alone


def test_a_long_function_and_a_long_module_are_found(tmp_path):
    short = "def short():\n" + "    x = 1\n" * 79  # 80 lines: allowed
    long = "class C:\n    async def long(self):\n" + "        x = 1\n" * 80  # 81
    root = _tree(tmp_path, {"__init__.py": "", "m.py": short + long})
    assert long_functions(root) == ["pkg/m.py:long (81 lines)"]
    assert long_modules(root, limit=161) == ["pkg/m.py (162 lines)"]
    assert long_modules(root) == []


def test_a_module_reaching_past_the_door_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "broker/__init__.py": "from pkg.broker.reads import Reads\n",
            "broker/reads.py": "from pkg.broker.common import x\n",
            "broker/common.py": "x = 1\n",
            "views.py": "from pkg.broker import Reads\n"
            "def f():\n    from pkg.broker import reads\n",
            "page.py": "from pkg.broker.reads import Reads\n",
        },
    )
    assert door_breaches(root) == ["pkg.page -> pkg.broker.reads", "pkg.views -> pkg.broker.reads"]


def test_a_module_beyond_the_allowed_top_list_is_found(tmp_path):
    root = _tree(tmp_path, {"__init__.py": "", "conf.py": "", "stray.py": "", "d/__init__.py": ""})
    assert extra_top_modules(root, frozenset({"conf"})) == ["stray"]


def test_a_hand_built_flow_member_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "scheduling/wire.py": "def flow_member(level, tenant):\n"
            '    return f"{level}\\n{tenant}"\n',
            "a.py": 'm = f"{s.level}\\n{s.tenant}"\nok = f"{day}\\n{tenant}"\n',
            "b.py": 'm = f"{lvl.value}\\n{tenant}"\n',
            "lua/x.lua": "local m = level .. '\\n' .. tenant\nlocal ok = day .. '\\n' .. f\n",
            "lua/y.lua": "fqLinePush(K, level .. '\\n' .. t, {id})\n",
        },
    )
    assert hand_built_members(root, frozenset({"scheduling/wire.py"})) == [
        "pkg/a.py:1", "pkg/b.py:1", "pkg/lua/x.lua:1", "pkg/lua/y.lua:1",
    ]  # fmt: skip


def test_a_test_module_imported_by_another_module_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "conftest.py": "from pkg.helpers import h\n",
            "helpers/__init__.py": "h = 1\n",
            "unit/__init__.py": "",
            "unit/test_a.py": "from pkg.helpers import h\nfrom pkg import conftest\n",
            "unit/test_b.py": "def test_b():\n    from pkg.unit.test_a import x\n",
            "e2e/__init__.py": "",
            "e2e/test_c.py": "import pkg.unit.test_b\n",
        },
    )
    assert imports_of_test_modules(root) == [
        "pkg.e2e.test_c -> pkg.unit.test_b",
        "pkg.unit.test_a -> pkg.conftest",
        "pkg.unit.test_b -> pkg.unit.test_a",
    ]


def test_a_console_page_of_another_shape_is_found(tmp_path):
    page = "from dataclasses import dataclass\n\n@dataclass(frozen=True)\nclass P:\n    x: int\n"
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "dashboard/__init__.py": "",
            "dashboard/good.py": page + "class G(ConsolePage):\n"
            "    def v(self, r):\n        return self.admin._context(r, 't', page=P(1))\n",
            "dashboard/loose.py": page + "class L(ConsolePage):\n"
            "    def v(self, r):\n        return self.admin._context(r, 't', rows=[])\n",
            "dashboard/two.py": page + "class A(ConsolePage): ...\nclass B(ConsolePage): ...\n",
            "dashboard/bare.py": "class C(ConsolePage): ...\n",
            "dashboard/helper.py": "def f(self, r):\n    return self._context(r, 't', x=1)\n",
            "dashboard/rendered.py": page + "class R(ConsolePage):\n"
            "    def v(self, r):\n        return self.admin._show(r, 'f', 't', rows=[])\n",
        },
    )
    assert page_shape_breaches(root) == [
        "pkg/dashboard/bare.py: no frozen dataclass",
        "pkg/dashboard/loose.py:8: _context without page= alone",
        "pkg/dashboard/rendered.py:8: _show without page= alone",
        "pkg/dashboard/two.py: 2 page classes",
    ]
