"""CONTRIBUTING.md's recipes held true to the code: the files a recipe names exist, and a
limit, a console route or a metric added outside the files its recipe names fails here.

A recipe is read from CONTRIBUTING.md itself (its backticked paths), so correcting the
recipe and moving the code go together. Each check is also tried on a small tree that
breaks it, so none passes by seeing nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fairqueue.scheduling.limits import LIMIT_FIELDS

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
#: A repository path in backticks (``admin/base_site.html``, Django's, is not one).
NAMED_PATH = re.compile(r"`((?:fairqueue|docs|tests)/(?:[\w.]+/)*[\w.<>]+\.(?:py|lua|html|md))`")
#: A metric family's name as the code spells it (the whole string, not prose about it).
METRIC_NAME = re.compile(r"queue_fair_[a-z0-9_]+")
#: Where a list of the limits may be written besides the recipe's files.
MIGRATIONS = "fairqueue/migrations/"


def recipe(text: str, title: str) -> str:
    """The recipe headed ``**<title>**``: up to the next recipe or section."""
    start = text.index(f"**{title}**")
    rest = text[start + len(title) + 4 :]
    ends = [i for i in (rest.find("\n**Add "), rest.find("\n## ")) if i >= 0]
    return rest[: min(ends)] if ends else rest


def step(text: str, number: int) -> str:
    """Step ``number`` of a recipe (a numbered item and its indented lines)."""
    found = re.search(rf"^{number}\. (.*?)(?=^\d+\. |^\S|\Z)", text, re.M | re.S)
    assert found, f"no step {number}"
    return found.group(1)


def named(text: str) -> set[str]:
    """The repository paths a piece of a recipe names."""
    return set(NAMED_PATH.findall(text))


def texts(root: Path) -> dict[str, str]:
    """The package's and the docs' files a recipe may name, by path from ``root``."""
    found = {}
    for folder, suffixes in (("fairqueue", {".py", ".lua", ".html"}), ("docs", {".md"})):
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in suffixes:
                found[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return found


def names_all(text: str, fields: tuple[str, ...]) -> bool:
    return all(re.search(rf"\b{field}\b", text) for field in fields)


def limit_lists_outside(files: dict[str, str], listed: set[str], fields: tuple[str, ...]):
    """Files that name every limit (a list of them: a new limit goes there too) but that
    the recipe's list step does not name (a migration aside)."""
    return sorted(
        path
        for path, text in files.items()
        if names_all(text, fields) and path not in listed and not path.startswith(MIGRATIONS)
    )


def limit_lists_missing(files: dict[str, str], listed: set[str], fields: tuple[str, ...]):
    """(file, field) for each limit a file of the list step does not name."""
    return [
        (path, field)
        for path in sorted(listed)
        for field in fields
        if not re.search(rf"\b{field}\b", files.get(path, ""))
    ]


def split_limit_fields(lua: str) -> int:
    """How many fields ``fqSplitLimits`` returns (the Lua's half of the encoded limits)."""
    body = lua[lua.index("function fqSplitLimits") :]
    returned = re.search(r"return \{([^}]*)\}", body)
    assert returned, "fqSplitLimits returns no table"
    return len(re.findall(r"=\s*f\[\d+\]", returned.group(1)))


def metric_homes(root: Path) -> dict[str, set[str]]:
    """Each metric family's name -> the package's modules that spell it as a whole
    string (a definition; prose in docstrings does not count)."""
    homes: dict[str, set[str]] = {}
    for path in sorted((root / "fairqueue").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if METRIC_NAME.fullmatch(node.value):
                    where = path.relative_to(root).as_posix()
                    homes.setdefault(node.value, set()).add(where)
    return homes


def route_makers(root: Path) -> list[str]:
    """Console modules that make a route themselves (importing Django's ``path`` or
    ``re_path``, under any name, or calling one) rather than through ``ConsoleAdmin._page``."""
    found = []
    for path in sorted((root / "fairqueue" / "dashboard").rglob("*.py")):
        if path.name == "console_admin.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "django.urls":
                made = any(alias.name in {"path", "re_path"} for alias in node.names)
            elif isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                made = name in {"path", "re_path"}
            else:
                made = False
            if made:
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return found


def pages_off_recipe(root: Path) -> list[str]:
    """Page templates (no leading ``_``) not extending the admin's base, or that no
    console module renders."""
    code = "\n".join(p.read_text(encoding="utf-8") for p in (root / "fairqueue").rglob("*.py"))
    wrong = []
    for path in sorted((root / "fairqueue" / "templates" / "fairqueue").glob("[!_]*.html")):
        first = path.read_text(encoding="utf-8").lstrip().split("\n", 1)[0]
        if first != '{% extends "admin/base_site.html" %}':
            wrong.append(f"{path.name}: does not extend admin/base_site.html")
        if f'"fairqueue/{path.name}"' not in code:
            wrong.append(f"{path.name}: no module renders it")
    return wrong


# -- the recipes, held to the code --------------------------------------------------------

RECIPES = CONTRIBUTING.read_text(encoding="utf-8")
LIMIT = recipe(RECIPES, "Add a per-tenant limit")
PAGE = recipe(RECIPES, "Add a console page")
METRIC = recipe(RECIPES, "Add a metric")


@pytest.mark.parametrize("title", ["Add a per-tenant limit", "Add a console page", "Add a metric"])
def test_every_file_a_recipe_names_exists(title):
    paths = named(recipe(RECIPES, title))
    assert paths, title
    missing = sorted(p for p in paths if "<" not in p and not (ROOT / p).exists())
    assert missing == [], missing


def test_every_list_of_the_limits_is_in_the_limit_recipe():
    files = texts(ROOT)
    listed = named(step(LIMIT, 3))
    assert limit_lists_outside(files, listed, LIMIT_FIELDS) == []
    assert limit_lists_missing(files, listed, LIMIT_FIELDS) == []


def test_a_limit_touches_at_most_five_files_of_code():
    code = sorted(p for p in named(LIMIT) if p.startswith("fairqueue/"))
    assert len(code) <= 5, code


def test_the_lua_reads_as_many_limit_fields_as_python_writes():
    lua = (ROOT / "fairqueue/broker/lua/include/wire.lua").read_text(encoding="utf-8")
    assert "fairqueue/broker/lua/include/wire.lua" in named(step(LIMIT, 2))
    assert split_limit_fields(lua) == len(LIMIT_FIELDS)


def test_console_routes_are_made_only_as_the_page_recipe_says():
    assert "fairqueue/dashboard/console_admin.py" in named(PAGE)
    assert route_makers(ROOT) == []
    assert pages_off_recipe(ROOT) == []


def test_every_metric_is_defined_documented_and_tested_as_the_recipe_says():
    homes = metric_homes(ROOT)
    allowed = named(step(METRIC, 1))
    assert homes, "no metric found"
    assert {name: sorted(at - allowed) for name, at in homes.items() if at - allowed} == {}
    operations = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    tests = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").rglob("*.py"))
    assert sorted(n for n in homes if n not in operations) == []
    assert sorted(n for n in homes if n not in tests) == []


# -- each check breaks on a small tree ----------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_limit_listed_outside_the_recipe_or_missing_from_it_is_found():
    fields = ("max_active", "max_waiting", "max_new")
    files = {
        "fairqueue/a.py": "max_active max_waiting max_new",
        "fairqueue/b.py": "max_active max_waiting",  # a recipe file the new limit missed
        "fairqueue/c.py": "(max_active, max_waiting, max_new)",  # a list off the recipe
        "fairqueue/migrations/0009_x.py": "max_active max_waiting max_new",
        "fairqueue/d.py": "max_active",
    }
    listed = {"fairqueue/a.py", "fairqueue/b.py"}
    assert limit_lists_outside(files, listed, fields) == ["fairqueue/c.py"]
    assert limit_lists_missing(files, listed, fields) == [("fairqueue/b.py", "max_new")]


def test_the_recipe_steps_and_paths_are_read():
    text = (
        "**Add x** (`y`, `admin/z.html`):\n\n"
        "1. `fairqueue/b.py` and\n   `fairqueue/d.lua`.\n2. `docs/e.md`\n\n**Add z**"
    )
    part = recipe(text, "Add x")
    assert named(step(part, 1)) == {"fairqueue/b.py", "fairqueue/d.lua"}
    assert named(step(part, 2)) == {"docs/e.md"}


def test_a_lua_split_missing_a_field_is_counted():
    lua = "local function fqSplitLimits(e)\n  return {maxActive = f[1], rateMax = f[2]}\nend"
    assert split_limit_fields(lua) == 2


def test_a_route_metric_or_page_off_the_recipe_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "fairqueue/dashboard/console_admin.py": "path('x', v)\n",
            "fairqueue/dashboard/extra.py": "from django.urls import path\nU = [path('y', v)]\n",
            "fairqueue/dashboard/alias.py": "from django.urls import re_path as p\n",
            "fairqueue/metrics.py": "A = 'queue_fair_a'\n",
            "fairqueue/other.py": "'''About ``queue_fair_a``.'''\nB = 'queue_fair_b'\n",
            "fairqueue/templates/fairqueue/page.html": "{% extends 'base.html' %}\n",
            "fairqueue/templates/fairqueue/_part.html": "partial\n",
        },
    )
    assert route_makers(root) == [
        "fairqueue/dashboard/alias.py:1",
        "fairqueue/dashboard/extra.py:1",
        "fairqueue/dashboard/extra.py:2",
    ]
    assert metric_homes(root) == {
        "queue_fair_a": {"fairqueue/metrics.py"},
        "queue_fair_b": {"fairqueue/other.py"},
    }
    assert pages_off_recipe(root) == [
        "page.html: does not extend admin/base_site.html",
        "page.html: no module renders it",
    ]


def test_what_reads_the_limits_declaration_lists_every_limit():
    """The files the limit recipe leaves out follow ``LIMITS``: a limit added to it is in
    the admin's list, the console's form and words and the encoded form with no edit."""
    from fairqueue.admin.plan_admin import TenantPlanAdmin
    from fairqueue.dashboard.limited_tenants import limits_in_words
    from fairqueue.dashboard.tenant_views import LimitsForm
    from fairqueue.scheduling.limits import LIMITS, TenantLimits
    from fairqueue.scheduling.wire import decoded_limits, encoded_limits

    assert [f for f in TenantPlanAdmin.list_display if f in LIMITS] == list(LIMIT_FIELDS)
    assert tuple(LimitsForm().fields) == ("weight", *LIMIT_FIELDS)
    every = TenantLimits(**{name: i + 1 for i, name in enumerate(LIMIT_FIELDS)}, paused=False)
    assert decoded_limits(encoded_limits(every)) == every
    assert len(encoded_limits(every).split("\n")) == len(LIMIT_FIELDS)
    shown = limits_in_words(every)
    assert [label for label, _ in shown] == [f.label for f in LIMITS.values() if f.label]
    assert all(value != "—" for _, value in shown)
