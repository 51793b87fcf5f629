"""The loader of fairqueue's Lua: what ``scripts.without_unused`` drops and keeps, and that
every shipped script still defines each function it calls and compiles in Redis."""

import re
from importlib.resources import files

import pytest

from fairqueue.broker import scripts

LUA = files(scripts.__package__).joinpath("lua")
#: Every shipped script: the wrapped ones and each of ``lua/*.lua`` (a new file is in).
SCRIPTS = [
    scripts.add_jobs_script,
    scripts.add_delayed_script,
    scripts.adopt_page_script,
    scripts.stalled_page_script,
    *(
        (lambda name=path.name.removesuffix(".lua"): scripts.plain_script(name))
        for path in sorted(LUA.iterdir(), key=lambda path: path.name)
        if path.name.endswith(".lua")
    ),
]
#: Where fairqueue's Lua hands a wrapped BullMQ script its own ARGV (BullMQ's positions).
_BULLMQS_ARGV = re.compile(r"^\s*ARGV\[1\](?:, ARGV\[\d\])* = ")


def test_an_unused_function_is_dropped_and_a_used_one_kept():
    source = (
        "local function fqUsed(a)\n  return a\nend\n"
        "local function fqUnused(b)\n  if b then\n    return fqUsed(b)\n  end\nend\n"
        "return fqUsed(1)\n"
    )
    kept = scripts.without_unused(source)
    assert "fqUnused" not in kept
    assert kept == "local function fqUsed(a)\n  return a\nend\nreturn fqUsed(1)\n"


def test_functions_used_only_by_dropped_ones_go_too_and_comments_do_not_keep_them():
    source = (
        "local fqTable = {a = 1}\n"
        "local function fqLeaf()\n  return fqTable.a\nend\n"
        "local function fqMiddle()\n  return fqLeaf()\nend\n"
        "-- fqMiddle and fqLeaf are mentioned here\n"
        "--[[ and fqLeaf here ]]\n"
        "return 1\n"
    )
    kept = scripts.without_unused(source)
    assert re.findall(r"local (?:function )?(fq\w+)", kept) == []
    assert kept.endswith("return 1\n")


def test_bullmqs_wrapped_script_and_values_from_calls_are_never_dropped():
    """A wrapper holds BullMQ's margin-level ``end`` lines (cutting at the first would
    break the script), and a value computed by a call may be a command's side effect."""
    source = (
        "local function fqBullmqAdd()\nlocal function inner()\nend\nend\n"
        "local fqSideEffect = redis.call('INCR', KEYS[1])\n"
        "local fqConstant = 4\n"
        "return 1\n"
    )
    kept = scripts.without_unused(source)
    assert "fqBullmqAdd" in kept
    assert "fqSideEffect" in kept
    assert "fqConstant" not in kept


@pytest.mark.parametrize("make", SCRIPTS, ids=lambda make: make().name)
def test_every_fairqueue_name_a_shipped_script_uses_is_defined_in_it(make):
    source = make().source
    code = scripts._COMMENT.sub("", source)
    defined = set(re.findall(r"\blocal function (fq\w+)", code))
    for names in re.findall(r"\blocal ((?:\w+, )*\w+)(?: =|\n)", code):
        defined |= set(names.split(", "))
    names_in_code = re.sub(r"'[^'\n]*'|\"[^\"\n]*\"", "''", code)  # not string literals
    used = set(re.findall(r"\b(fq[A-Z]\w*)\b", names_in_code))
    assert used <= defined, f"{make().name} uses {sorted(used - defined)} without defining them"


def _strings_holding_a_comment_mark(source: str) -> list[str]:
    """The string literals of ``source`` that hold ``--`` (outside comments)."""
    found, i, n = [], 0, len(source)
    while i < n:
        if source.startswith("--", i):  # a comment: to its "]]" or its line's end
            end = source.find("]]", i) + 2 if source.startswith("--[[", i) else 0
            i = end if end >= 2 else (source.find("\n", i) + 1 or n)
        elif source[i] in "'\"":
            quote, j = source[i], i + 1
            while j < n and source[j] not in (quote, "\n"):
                j += 2 if source[j] == "\\" else 1
            if "--" in source[i : j + 1]:
                found.append(source[i : j + 1])
            i = j + 1
        else:
            i += 1
    return found


def test_the_comment_mark_finder_sees_strings_and_skips_comments():
    source = "local a = '--x' -- it's 'a -- b'\n--[[ 'c -- d' ]]\nlocal b = \"e--\"\n"
    assert _strings_holding_a_comment_mark(source) == ["'--x'", '"e--"']


@pytest.mark.parametrize("make", SCRIPTS, ids=lambda make: make().name)
def test_no_shipped_script_has_a_comment_mark_in_a_string(make):
    """without_unused strips comments with a pattern that would also cut such a string
    (and could then take a used function for unused)."""
    assert _strings_holding_a_comment_mark(make().source) == []


@pytest.mark.parametrize("make", SCRIPTS, ids=lambda make: make().name)
def test_every_shipped_script_compiles_in_redis(make, redis_client):
    script = make()
    assert redis_client.script_load(script.source) == script.sha


def test_the_add_script_carries_only_what_it_calls():
    source = scripts.add_jobs_script().source
    for dropped in ("fqSetScore", "fqIndex(", "fqOccupied", "fqSyncHolds", "fqRankLevel"):
        assert f"local function {dropped}" not in source and f"local {dropped} " not in source


def test_every_lua_file_is_a_shipped_script_or_included_by_one():
    shipped = {make().name for make in SCRIPTS}
    own = {path.name.removesuffix(".lua") for path in LUA.iterdir() if path.name.endswith(".lua")}
    wrapped = {path.name.split(".")[0] for path in LUA.joinpath("wrap").iterdir()}
    assert own | wrapped == shipped


def test_fairqueues_lua_reads_its_arguments_by_name_only():
    """No ``ARGV[3]`` in fairqueue's Lua (comments aside): each script reads what its
    ``--- @argv`` lines name; only a wrapper's handing BullMQ's script its own ARGV is
    positional (BullMQ's positions, pinned by test_broker_contract)."""
    folders = (LUA, LUA.joinpath("include"), LUA.joinpath("wrap"))
    numbered = [
        f"{path.name}: {line.strip()}"
        for folder in folders
        for path in folder.iterdir()
        if path.name.endswith(".lua")
        for line in scripts._COMMENT.sub("", path.read_text(encoding="utf-8")).splitlines()
        if re.search(r"ARGV\[\d", line) and not _BULLMQS_ARGV.match(line)
    ]
    assert numbered == []
    # the check sees what it looks for
    assert re.search(r"ARGV\[\d", "local token = ARGV[1]")
    assert not _BULLMQS_ARGV.match("local token = ARGV[1]")


@pytest.mark.parametrize("make", SCRIPTS, ids=lambda make: make().name)
def test_every_shipped_script_declares_the_arguments_it_reads(make):
    """A shipped script has its arguments declared and none left unrendered."""
    script = make()
    code = scripts._COMMENT.sub("", script.source)
    assert "ARGV." not in code
    assert script.argv.names or script.argv.rest
