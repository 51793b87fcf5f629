"""Scripts' arguments by name (``scripts.Argv``): what a ``--- @argv`` declaration
renders in the Lua and what a Python call must give. The shipped scripts' own
declarations are checked in tests/redis/test_scripts.py, where they compile."""

import re

import pytest

from fairqueue.broker.scripts import Argv

LOCK = Argv.declared("lock", "--- @argv token ttl\nreturn ARGV.token .. ARGV.ttl\n")


def test_named_arguments_render_as_their_positions():
    text = "--- @argv token ttl cursor\nlocal t = ARGV.token\nif ARGV.cursor ~= '' then end\n"
    argv = Argv.declared("seek", text)
    rendered = argv.render(text)
    assert "local t = ARGV[1]\nif ARGV[3] ~= '' then end\n" in rendered
    assert "ARGV." not in rendered.split("\n", 1)[1]


def test_a_rest_renders_from_its_first_position():
    text = "--- @argv shown\n--- @argv tenants...\n"
    text += "for i = 1, #ARGV.tenants do f(ARGV.tenants[i + 1]) end"
    rendered = Argv.declared("rows", text).render(text)
    assert rendered.endswith("for i = 1, (#ARGV - 1) do f(ARGV[1 + i + 1]) end")
    whole = "--- @argv rows...\nx = ARGV.rows[i] .. #ARGV.rows"
    assert Argv.declared("pairs", whole).render(whole).endswith("x = ARGV[i] .. #ARGV")


@pytest.mark.parametrize(
    "use", ["ARGV.tokn", "#ARGV.token", "ARGV.token[1]", "ARGV.rest", "#ARGV.rest[1]"]
)
def test_a_name_not_declared_or_misused_is_refused_when_the_script_loads(use):
    argv = Argv.declared("s", "--- @argv token\n--- @argv rest...\n")
    with pytest.raises(ValueError, match=re.escape(use.split("[")[0])):
        argv.render(f"local x = {use}\n")


@pytest.mark.parametrize(
    "declaration",
    [
        "token token",  # twice
        "token? ttl",  # a required one after an optional one
        "token? rest...",  # an optional one and a rest
        "rest... token",  # a name after the rest
        "Token",  # not a lower-case name
    ],
)
def test_bad_declarations_are_refused(declaration):
    with pytest.raises(ValueError, match="@argv"):
        Argv.declared("s", f"--- @argv {declaration}\n")


def test_a_call_gives_arguments_by_name_in_the_declared_order():
    assert LOCK.values({"ttl": 5000, "token": "t"}) == ["t", 5000]
    argv = Argv.declared("rows", "--- @argv shown tenants...\n")
    assert argv.values({"tenants": ["a", "b"], "shown": 3}) == [3, "a", "b"]
    assert argv.values({"tenants": [], "shown": 3}) == [3]


@pytest.mark.parametrize(
    "given, complaint",
    [
        ({"token": "t"}, "lock takes (token, ttl), was given (token)"),
        ({"token": "t", "ttl": 1, "tll": 1}, "was given (token, ttl, tll)"),
        ({"token": None, "ttl": 1}, "argument token is None"),
    ],
)
def test_a_missing_unknown_or_none_argument_is_a_type_error_at_the_call(given, complaint):
    with pytest.raises(TypeError, match=re.escape(complaint)):
        LOCK.values(given)


def test_optional_arguments_are_left_off_from_the_end_only():
    argv = Argv.declared("release", "--- @argv mode score? member?\n")
    assert argv.values({"mode": "release"}) == ["release"]
    assert argv.values({"mode": "scan", "score": "", "member": "m"}) == ["scan", "", "m"]
    with pytest.raises(TypeError, match=re.escape("takes (mode, score?, member?)")):
        argv.values({"mode": "scan", "member": "m"})  # would be read as the score


def test_a_rest_is_required_and_must_be_a_list():
    argv = Argv.declared("pairs", "--- @argv rows...\n")
    with pytest.raises(TypeError, match=re.escape("takes (rows...), was given ()")):
        argv.values({})
    with pytest.raises(TypeError, match="rows... is 'ab', not a list"):
        argv.values({"rows": "ab"})
